"""Character-level text with no download: the Python documentation that
ships with the interpreter (`pydoc_data.topics`, about 465 k characters).

`CharVocab` maps characters to ids; `char_lm_split` cuts the text into
non-overlapping windows of `context + 1` characters, each giving the inputs
`ids[:-1]` and the next-character labels `ids[1:]`, and holds out the last
`validation` fraction of the text (a contiguous tail: no window of it
overlaps training text). `generate` samples text from a trained model.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr._arguments import int_at_least, real_as_float, real_number
from atomr.train.core.errors import NonFiniteError
from atomr.train.core.model.inputs import token_vocab
from atomr.train.core.model.sequential import Sequential
from atomr.train.core.validation import check_token_ids

__all__ = ["MAX_GENERATE_LENGTH", "CharVocab", "char_lm_split", "generate", "pydoc_text"]

MAX_GENERATE_LENGTH = 1_000_000
"""The most characters one `generate` call samples: each costs a whole
forward pass, so a million is hours of work, more likely a mistaken argument
than a wish."""


def pydoc_text() -> str:
    """Every topic of `pydoc_data.topics`, in key order, joined.

    Raises:
        ImportError: this Python ships without `pydoc_data`.
    """
    from pydoc_data import topics  # noqa: PLC0415 - the standard library's, imported on use

    return "".join(topics.topics[key] for key in sorted(topics.topics))


@dataclass(frozen=True)
class CharVocab:
    """The characters of a text, sorted; a character's id is its index.

    Attributes:
        chars: the characters, each once (in any order: `of` sorts them).

    Raises:
        TypeError: `chars` is not a str.
        ValueError: a character repeats.
    """

    chars: str

    def __post_init__(self) -> None:
        """Raises TypeError unless `chars` is a str, ValueError when a
        character repeats (its ids would disagree: `encode` gives the last,
        `decode` reads every one)."""
        if not isinstance(self.chars, str):
            raise TypeError(f"chars must be a str, got {type(self.chars).__name__}")
        if len(set(self.chars)) != len(self.chars):
            repeated = sorted(c for c, k in Counter(self.chars).items() if k > 1)
            raise ValueError(f"chars must not repeat a character; repeated: {repeated[:8]!r}")

    @classmethod
    def of(cls, text: str) -> CharVocab:
        """The vocabulary of `text`."""
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """The ids of `text` (int64).

        Raises:
            TypeError: `text` is not a str.
            ValueError: a character outside the vocabulary.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        index = {c: i for i, c in enumerate(self.chars)}
        try:
            return np.array([index[c] for c in text], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`, a 1-D sequence or array of ids (empty: "").

        Raises:
            TypeError: `ids` is not 1-D, or holds something other than
                integers (floats, bools, strings).
            ValueError: an id outside `[0, len(self))`.
        """
        try:
            array = np.asarray(ids)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"ids must be a 1-D sequence of integers: {exc}") from None
        if array.ndim != 1:
            raise TypeError(f"ids must be a 1-D sequence of integers, got {array.ndim}-D")
        if array.size == 0:
            return ""
        check_token_ids(array, len(self), "ids")
        return "".join(self.chars[i] for i in array.tolist())


def _windows(ids: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    n = (len(ids) - 1) // context
    x = np.stack([ids[k * context : (k + 1) * context] for k in range(n)])
    y = np.stack([ids[k * context + 1 : (k + 1) * context + 1] for k in range(n)])
    return x, y


def char_lm_split(
    text: str, context: int, validation: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, CharVocab]:
    """Training and validation windows of a character language model.

    Args:
        text: the text (e.g. `pydoc_text()`).
        context: characters per window.
        validation: the fraction of the text, at its end, held out.

    Returns:
        `(x_train, y_train, x_val, y_val, vocab)`: int64 `(windows, context)`.

    Raises:
        TypeError: `text` is not a str, `context` not an int or `validation`
            not a number (a bool is neither).
        ValueError: a context below 1, a fraction outside (0, 1), or a text
            too short for one window on each side.
    """
    context = int_at_least("context", context)
    if not 0.0 < real_number("validation", validation) < 1.0:
        raise ValueError(f"validation must be in (0, 1), got {validation!r}")
    vocab = CharVocab.of(text)
    ids = vocab.encode(text)
    cut = int(len(ids) * (1.0 - validation))
    if cut <= context + 1 or len(ids) - cut <= context + 1:
        raise ValueError(f"a text of {len(ids)} characters is too short for context {context}")
    x_train, y_train = _windows(ids[:cut], context)
    x_val, y_val = _windows(ids[cut:], context)
    return x_train, y_train, x_val, y_val, vocab


def _check_model(model: Any, vocab: Any) -> None:
    """Raises TypeError / ValueError unless `model` takes token ids and
    gives logits over exactly `vocab`'s characters."""
    if not isinstance(vocab, CharVocab):
        raise TypeError(f"vocab must be a CharVocab, got {type(vocab).__name__}")
    if not isinstance(model, Sequential) or model.input_kind != "tokens":
        raise TypeError("model must be a Sequential taking token ids (as gpt(...) builds)")
    size, window, takes = len(vocab), model.in_shape[0], token_vocab(model.layers[0])
    if takes != size or model.out_shape != (window, size):
        raise ValueError(
            f"vocab has {size} characters; the model takes ids below {takes} and gives "
            f"logits of shape {model.out_shape}, not ({window}, {size})"
        )


def _check_sampling(prompt: Any, length: Any, temperature: Any) -> tuple[int, float]:
    """`(length, temperature)` as an int and a float.

    Raises:
        TypeError / ValueError: `prompt` is not a non-empty str, `length` not
            an int in [0, MAX_GENERATE_LENGTH] or `temperature` not a finite
            number > 0.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("prompt must not be empty (the model needs a first character)")
    if isinstance(length, bool) or not isinstance(length, numbers.Integral):
        raise TypeError(f"length must be an int, got {length!r}")
    count = int(length)
    if not 0 <= count <= MAX_GENERATE_LENGTH:
        raise ValueError(f"length must be in [0, {MAX_GENERATE_LENGTH}], got {count}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    divisor = real_as_float(temperature)
    if not (math.isfinite(divisor) and divisor > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature!r}")
    return count, divisor


def generate(
    model: Sequential,
    vocab: CharVocab,
    prompt: str,
    length: int,
    *,
    temperature: float = 0.8,
    seed: int = 0,
) -> str:
    """Sample `length` characters after `prompt` from a trained token model.

    The model takes exactly `model.in_shape[0]` ids; a shorter history is
    padded after its end (causal attention never looks there) and the logits
    are read at its last position; a longer one is cut to its last window.
    Every argument is checked before the first forward pass.

    Args:
        model: a token model whose ids and logits both range over `vocab`
            (as `gpt(len(vocab), ...)` builds).
        vocab: the characters the model was trained on.
        prompt: the text to continue (non-empty, of `vocab`'s characters).
        length: characters to sample, 0 to `MAX_GENERATE_LENGTH`.
        temperature: the logits' divisor (finite, > 0; a tiny one samples
            the most likely character).
        seed: the sampling's seed.

    Returns:
        The `length` sampled characters (the prompt excluded).

    Raises:
        TypeError: a model that does not take token ids, a vocab that is not
            a `CharVocab`, a prompt that is not a str, a length or seed that
            is not an int (a bool is none) or a temperature that is not a
            number.
        ValueError: a model whose vocabulary or output is not `vocab`'s size,
            an empty prompt, a prompt character outside the vocabulary, a
            length outside [0, MAX_GENERATE_LENGTH], a negative seed, or a
            temperature that is not finite and positive.
        NonFiniteError: the model's logits are NaN or infinite (it was
            'Probabilities contain NaN', from NumPy's sampler).
    """
    _check_model(model, vocab)
    count, divisor = _check_sampling(prompt, length, temperature)
    seed = int_at_least("seed", seed, 0, high=None)
    try:
        ids = vocab.encode(prompt).tolist()
    except ValueError as exc:
        raise ValueError(f"prompt: {exc}") from None
    rng = np.random.default_rng(seed)
    window = model.in_shape[0]
    for _ in range(count):
        history = ids[-window:]
        x = np.zeros((1, window), dtype=np.int64)
        x[0, : len(history)] = history
        logits = np.asarray(model.backend.to_host(model.forward(model.backend.to_device(x))))
        row = logits[0, len(history) - 1].astype(np.float64)
        if not np.isfinite(row).all():
            raise NonFiniteError(
                f"the model's logits after {len(ids) - len(prompt)} sampled characters "
                "are NaN or infinite (are its weights?)"
            )
        with np.errstate(over="ignore"):  # a tiny temperature: -inf, a probability of 0
            p = np.exp((row - row.max()) / divisor)
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(ids[len(prompt) :])
