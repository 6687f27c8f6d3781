"""Character-level text: the Python documentation as windows with a held-out
tail, the vocabulary round trip, and generation from a model."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from atomr.train import Mlp
from atomr.train.core.errors import NonFiniteError
from atomr.train.core.model import gpt
from atomr.train.core.text import CharVocab, char_lm_split, generate, pydoc_text


def test_pydoc_is_split_into_windows_and_next_characters() -> None:
    text = pydoc_text()
    assert len(text) > 400_000
    x_tr, y_tr, x_val, y_val, vocab = char_lm_split(text, 32)
    assert x_tr.shape[1] == 32 and x_tr.dtype == np.int64
    np.testing.assert_array_equal(x_tr[:, 1:], y_tr[:, :-1])  # labels: the next characters
    assert vocab.decode(x_tr[0]) == text[:32]
    assert vocab.decode(y_tr[0]) == text[1:33]
    held_out = len(x_val) * 32 / (len(x_tr) * 32 + len(x_val) * 32)
    assert 0.09 < held_out < 0.11
    cut = int(len(text) * 0.9)
    assert vocab.decode(x_val[0]) == text[cut : cut + 32]  # the tail, after every training window


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"context": True}, TypeError, "context must be an int, got True"),
        ({"context": 4.0}, TypeError, "context must be an int, got 4.0"),
        ({"context": 0}, ValueError, "context must be >= 1, got 0"),
        ({"context": 4, "validation": "0.1"}, TypeError, "validation must be a real number"),
        ({"context": 4, "validation": 1.0}, ValueError, "validation must be in (0, 1), got 1.0"),
    ],
)
def test_a_context_or_fraction_of_the_wrong_type_is_named(
    kwargs: dict[str, Any], error: type, needle: str
) -> None:
    """`context=True` cut windows of one character; a float context failed
    inside NumPy, a str fraction as a comparison of float and str."""
    with pytest.raises(error) as info:
        char_lm_split("abcdefghij" * 10, **kwargs)
    assert needle in str(info.value)


def test_the_vocabulary_round_trips_and_refuses_strangers() -> None:
    vocab = CharVocab.of("hello world")
    assert vocab.decode(vocab.encode("low")) == "low"
    assert len(vocab) == 8
    with pytest.raises(ValueError, match="'z'"):
        vocab.encode("zebra")
    with pytest.raises(ValueError):
        char_lm_split("short", 32)


def test_generation_is_seeded_and_stays_in_the_vocabulary() -> None:
    vocab = CharVocab.of("abcdefgh ")
    model = gpt(len(vocab), 8, n_layer=1, d_model=8, n_head=2, seed=1)
    first = generate(model, vocab, "abc", 20, seed=3)
    assert len(first) == 20 and set(first) <= set(vocab.chars)
    assert generate(model, vocab, "abc", 20, seed=3) == first
    assert generate(model, vocab, "abcdefgh abc", 5, seed=3)  # longer than the context
    with pytest.raises(ValueError):
        generate(model, vocab, "", 5)


@pytest.mark.parametrize(
    ("ids", "error", "needle"),
    [
        ([-1], ValueError, "ids must be in [0, 3), got -1 .. -1"),  # was: "c"
        ([0, 3], ValueError, "ids must be in [0, 3), got 0 .. 3"),  # was: an IndexError
        ([1.7], TypeError, "ids must be integers, got float64"),  # was: "b"
        ([True], TypeError, "ids must be integers, got bool"),
        (np.array([[0, 1]]), TypeError, "ids must be a 1-D sequence of integers, got 2-D"),
        ("ab", TypeError, "ids must be a 1-D sequence of integers, got 0-D"),
    ],
)
def test_decode_refuses_ids_it_has_no_character_for(ids: Any, error: type, needle: str) -> None:
    vocab = CharVocab.of("abc")
    with pytest.raises(error, match=re.escape(needle)):
        vocab.decode(ids)
    assert vocab.decode(np.array([2, 0], np.uint8)) == "ca"
    assert vocab.decode([]) == ""


def test_encode_takes_only_a_str() -> None:
    with pytest.raises(TypeError, match="text must be a str, got list"):
        CharVocab.of("abc").encode(["a", "b"])  # type: ignore[arg-type]


VOCAB = CharVocab.of("abcdefgh ")


@pytest.mark.parametrize(
    ("change", "error", "needle"),
    [
        ({"length": -3}, ValueError, "length must be in [0, 1000000], got -3"),
        ({"length": 10**6 + 1}, ValueError, "length must be in [0, 1000000]"),
        ({"length": 2.5}, TypeError, "length must be an int, got 2.5"),
        ({"length": True}, TypeError, "length must be an int"),
        ({"prompt": ""}, ValueError, "prompt must not be empty"),
        ({"prompt": "abz"}, ValueError, "prompt: character 'z' is not in the vocabulary"),
        ({"prompt": b"ab"}, TypeError, "prompt must be a str, got bytes"),
        ({"temperature": float("inf")}, ValueError, "temperature must be finite and > 0"),
        ({"temperature": float("nan")}, ValueError, "temperature must be finite and > 0"),
        ({"temperature": 0.0}, ValueError, "temperature must be finite and > 0"),
        ({"temperature": "1"}, TypeError, "temperature must be a number, got '1'"),
        ({"vocab": CharVocab.of("abc")}, ValueError, "vocab has 3 characters"),
        ({"vocab": "abcdefgh "}, TypeError, "vocab must be a CharVocab, got str"),
        ({"model": gpt(12, 8, n_layer=1, d_model=8, n_head=2)}, ValueError, "ids below 12"),
        ({"model": Mlp([8, 9])}, TypeError, "model must be a Sequential taking token ids"),
        ({"seed": -1}, ValueError, "seed must be >= 0, got -1"),  # was: NumPy's, unnamed
        ({"seed": True}, TypeError, "seed must be an int, got True"),  # was: seed 1
    ],
)
def test_generation_refuses_bad_arguments_before_a_forward_pass(
    change: dict[str, Any], error: type, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = gpt(len(VOCAB), 8, n_layer=1, d_model=8, n_head=2, seed=1)
    args: dict[str, Any] = {"model": model, "vocab": VOCAB, "prompt": "abc", "length": 4}
    args.update(change)

    def no_forward(*_: Any) -> None:
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(args["model"], "forward", no_forward)
    with pytest.raises(error, match=re.escape(needle)):
        generate(**args)


def test_a_tiny_temperature_samples_the_most_likely_character() -> None:
    model = gpt(len(VOCAB), 8, n_layer=1, d_model=8, n_head=2, seed=1)
    greedy = generate(model, VOCAB, "abc", 12, temperature=1e-320, seed=1)  # was: NaN
    assert generate(model, VOCAB, "abc", 12, temperature=1e-320, seed=2) == greedy
    assert len(greedy) == 12 and generate(model, VOCAB, "abc", 0) == ""


async def test_a_small_gpt_beats_the_unigram_baseline_on_held_out_text() -> None:
    from atomr import ActorSystem
    from atomr.accel import cpu_devices
    from atomr.train import (
        DataParallelTrainer,
        Evaluate,
        LossKind,
        OptimizerKind,
        Step,
        TrainerConfig,
    )

    x_tr, y_tr, x_val, y_val, vocab = char_lm_split(pydoc_text(), 32)
    counts = np.bincount(y_tr.reshape(-1), minlength=len(vocab)) / y_tr.size
    unigram = float(-np.mean(np.log(counts[y_val.reshape(-1)])))  # about 3.24 nats
    model = gpt(len(vocab), 32, n_layer=1, n_head=2, d_model=32, seed=0)
    config = TrainerConfig(OptimizerKind.adamw(0.01), LossKind.CROSS_ENTROPY, gradient_clip=1.0)
    order = np.random.default_rng(0).permutation(len(x_tr))
    async with ActorSystem("char-lm") as system:
        trainer = await DataParallelTrainer.spawn(system, model, cpu_devices(2), config)
        for step in range(150):
            rows = order[(step * 32) % len(order) :][:32]
            await trainer.ask(Step(x_tr[rows], y_tr[rows]), timeout=120)
        result = await trainer.ask(Evaluate(x_val[:512], y_val[:512]), timeout=120)
    assert result.loss < unigram - 0.5, (result.loss, unigram)


@pytest.mark.parametrize(
    ("chars", "error", "needle"),
    [
        ("aab", ValueError, "repeated: ['a']"),
        (["a", "b"], TypeError, "chars must be a str, got list"),
    ],
)
def test_a_vocabulary_refuses_repeated_characters_or_no_str(
    chars: Any, error: type, needle: str
) -> None:
    """`CharVocab("aab")` was taken: 'a' encoded as 1, while 0 decoded as 'a'."""
    with pytest.raises(error) as info:
        CharVocab(chars)
    assert needle in str(info.value)
    assert CharVocab("ba").decode(CharVocab("ba").encode("ab")) == "ab"  # any order is a vocabulary


def test_generation_from_a_model_of_nan_weights_is_a_non_finite_error() -> None:
    """It failed in NumPy's sampler as 'Probabilities contain NaN'."""
    vocab = CharVocab.of("abc")
    model = gpt(len(vocab), 4, n_layer=1, n_head=1, d_model=4)
    model.params[:] = np.nan  # diverged (set_params refuses NaN weights)
    with pytest.raises(NonFiniteError, match="logits after 0 sampled characters are NaN"):
        generate(model, vocab, "ab", 3)
