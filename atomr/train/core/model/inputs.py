"""What a model takes and is built of: its input kind and shape, its dtype,
for token ids their range, its sizes, the keys of its config and its
parameter vector; checked once, where a model (or a server holding its
weights) is built."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from atomr._arguments import int_at_least, sequence_entries
from atomr.actor.errors import bounded_repr
from atomr.train.core.validation import cast_finite

__all__ = [
    "INPUT_KINDS",
    "MLP_KEYS",
    "SEQUENTIAL_KEYS",
    "known_keys",
    "model_dtype",
    "model_input",
    "params_vector",
    "positive_int",
    "positive_ints",
    "real_vector",
    "token_vocab",
]

INPUT_KINDS = ("float", "tokens")
"""What a model takes: float features (of the model's dtype) or int64 token ids."""

MLP_KEYS = ("sizes", "activation", "dtype", "activate_last", "seed")
"""Every key an `Mlp.config()` has written, in any version (one older than
`activate_last` lacks it), as has a pipeline's merged config of an `Mlp`."""

SEQUENTIAL_KEYS = ("kind", "layers", "input_shape", "input_kind", "dtype", "seed")
"""Every key a `Sequential.config()` has written (a GPT's and a pipeline's
merged config too)."""


def model_dtype(dtype: Any) -> np.dtype:
    """`dtype` as a NumPy dtype, checked to be one a model computes in.

    Raises:
        ValueError: not float32 or float64 (None included: NumPy reads it
            as float64).
    """
    if dtype is None:
        raise ValueError("dtype must be float32 or float64, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"dtype must be float32 or float64, got {bounded_repr(dtype)}") from exc
    if dt not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dt}")
    return dt


def token_vocab(layer: Any) -> int:
    """The range of the token ids `layer`, a token model's first, takes.

    Raises:
        ValueError: it has no `vocab` attribute, or one that is not an int >= 1.
    """
    vocab = getattr(layer, "vocab", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(
            f"input_kind 'tokens' needs a first layer that says its vocabulary (an int "
            f"`vocab` >= 1, as Embedding has); {type(layer).__name__} has {vocab!r}"
        )
    return vocab


def positive_int(name: str, value: object) -> int:
    """`value` as an int, checked to be one >= 1 (a bool or a float is not)
    and at most `INDEX_MAX` (`_arguments.int_at_least`: no array indexes more).

    Raises:
        ValueError: anything else (the message names `name`).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {bounded_repr(value)}")
    return int_at_least(name, value)


def positive_ints(name: str, values: object) -> tuple[int, ...]:
    """`values`, a list, tuple or 1-D array of positive ints
    (`_arguments.sequence_entries`), as a tuple.

    Raises:
        ValueError: not such a sequence (a string is not), or an entry that
            is not a positive int (named by its index: `name[i]`).
    """
    try:
        entries = sequence_entries(name, values, "positive ints")
    except TypeError as exc:  # a model config that does not build is a ValueError
        raise ValueError(str(exc)) from None
    return tuple(positive_int(f"{name}[{i}]", v) for i, v in enumerate(entries))


def model_input(first_layer: Any, input_shape: object, input_kind: object) -> tuple[int, ...]:
    """A model's per-sample input shape, checked with its input kind.

    Raises:
        ValueError: an unknown input kind, token input into a first layer
            without an int `vocab`, or an `input_shape` that is not a
            non-empty list of positive ints (the message names the entry).
    """
    if input_kind not in INPUT_KINDS:
        raise ValueError(f"input_kind must be one of {INPUT_KINDS}, got {bounded_repr(input_kind)}")
    if input_kind == "tokens":
        token_vocab(first_layer)
    shape = positive_ints("input_shape", input_shape)
    if not shape:
        raise ValueError("input_shape must have at least one axis, got ()")
    return shape


def known_keys(what: str, config: Mapping[str, Any], known: Collection[str]) -> None:
    """Refuse a config key that is not in `known`: a typo (`"activaton"`)
    would otherwise be ignored and leave the default in its place.

    Raises:
        ValueError: naming the first unknown key, `what` and the known keys.
    """
    for key in config:
        if key not in known:
            raise ValueError(
                f"{what} config has an unknown key {bounded_repr(key)}; known: {list(known)}"
            )


def params_vector(host: Any, dtype: np.dtype, n_params: int, *, checked: bool = True) -> np.ndarray:
    """`host` as a model's flat contiguous vector of `dtype`, checked
    (`real_vector`): a user's NaN weights are refused here, not trained from.
    `checked=False` (weights checked where they came in, handed on each
    step) checks the length only, sparing a pass over the vector.

    Raises:
        TypeError: (checked) not real numbers (bools, complex numbers, strings).
        ValueError: not `n_params` values; checked: NaN or Inf, or a finite
            value that the cast to `dtype` makes infinite (1e300 into float32).
    """
    if checked:
        flat = real_vector("params", host, dtype)
    else:
        flat = np.ascontiguousarray(np.asarray(host).reshape(-1), dtype=dtype)
    if flat.shape[0] != n_params:
        raise ValueError(f"params has {flat.shape[0]} values, the model needs {n_params}")
    return flat


def real_vector(name: str, host: Any, dtype: Any) -> np.ndarray:
    """`host` as a flat contiguous vector of `dtype`: real numbers, finite
    after the cast (`validation.cast_finite`, the one rule of that); model
    parameters, a parameter server's weights, a replica's given gradients.

    Args:
        name: the name for the messages, plural ("params", "initial_weights").
        host: what was given (an array, a list).
        dtype: the dtype the vector is used in.

    Returns:
        The vector (`host` itself, flattened, when it already is one).

    Raises:
        TypeError: not real numbers (bools, complex numbers, strings).
        ValueError: NaN or Inf, before or after the cast (the message says
            which).
    """
    array = np.asarray(host)
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be real numbers, got dtype {array.dtype}")
    return cast_finite(array.reshape(-1), dtype, name, ValueError)
