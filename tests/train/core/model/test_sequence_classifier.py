"""A token model with one output row per sample (a sequence classifier:
ids `(batch, T)`, logits `(batch, classes)`) takes one label per sample,
`(batch,)`, in every trainer, and equals one device; labels shaped like the
ids are refused with the shape the model expects, as a GPT's `(batch,)`
labels are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr import ActorSystem
from atomr.accel import cpu_devices
from atomr.train import Evaluate, GetWeights, InvalidBatchError, Step, Trainer
from atomr.train.core.model import (
    Embedding,
    ForwardContext,
    Layer,
    Linear,
    Sequential,
    gpt,
    gradient_check,
    register_layer,
)
from atomr.train.core.models import batch_spec

from .test_models import CONFIG, STRATEGIES, VOCAB, T

CLASSES, BATCH = 3, 12


@register_layer
class MeanOverPositions(Layer):
    """`(T, d) -> (d,)`: the mean over the sequence (NumPy, CPU devices)."""

    kind = "test_mean_over_positions"

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(in_shape) != 2:
            raise ValueError(f"MeanOverPositions takes (T, d), got {in_shape}")
        return (in_shape[1],)

    def forward(self, be: Any, params: list[Any], x: Any, ctx: ForwardContext) -> tuple[Any, Any]:
        return np.ascontiguousarray(x.mean(axis=1)), x.shape[1]

    def backward(self, be, params, grads, saved, dy, accumulate, input_grad):  # noqa: ANN001, ANN201
        if not input_grad:
            return None
        return np.ascontiguousarray(np.repeat(dy[:, None, :] / saved, saved, axis=1))

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind}


def _classifier() -> Sequential:
    layers = [Embedding(VOCAB, 8, T), MeanOverPositions(), Linear(8, CLASSES)]
    return Sequential(layers, (T,), input_kind="tokens", seed=4)


def _batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sequences labelled by their most frequent id modulo `CLASSES`."""
    ids = np.random.default_rng(3).integers(0, VOCAB, (steps, BATCH, T))
    counts = (ids[..., None] % CLASSES == np.arange(CLASSES)).sum(axis=2)
    return [(x, y) for x, y in zip(ids, counts.argmax(axis=-1), strict=True)]


def test_the_pooling_layer_has_its_gradient() -> None:
    assert gradient_check(MeanOverPositions(), (T, 4)) < 1e-6


def test_labels_follow_the_models_output_not_its_ids() -> None:
    ids = np.zeros((BATCH, T), dtype=np.int64)
    classifier, decoder = batch_spec(_classifier().config()), batch_spec(gpt(VOCAB, T).config())
    assert classifier.validate(ids, np.zeros(BATCH, int), CONFIG.loss)[1].shape == (BATCH,)
    assert decoder.validate(ids, np.zeros((BATCH, T), int), CONFIG.loss)[1].shape == (BATCH, T)
    with pytest.raises(InvalidBatchError, match=rf"shape \({BATCH},\), got \({BATCH}, {T}\)"):
        classifier.validate(ids, np.zeros((BATCH, T), int), CONFIG.loss)
    with pytest.raises(InvalidBatchError, match=rf"shape \({BATCH}, {T}\), got \({BATCH},\)"):
        decoder.validate(ids, np.zeros(BATCH, int), CONFIG.loss)


async def _run(system: ActorSystem, cls: Any, options: Any, n: int) -> Any:
    devices = ["cpu:0"] if cls is Trainer else cpu_devices(n)
    trainer = await cls.spawn(system, _classifier(), devices, CONFIG, options)
    losses = [(await trainer.ask(Step(x, y), timeout=30)).loss for x, y in _batches(5)]
    return trainer, losses, await trainer.ask(Evaluate(*_batches(1)[0]))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
async def test_a_sequence_classifier_trains_as_on_one_device(strategy: str, tmp_path: Path) -> None:
    cls, options, n = STRATEGIES[strategy]
    n = min(n, 2)  # two of its three layers hold parameters: at most two stages
    async with ActorSystem("seq-cls") as system:
        single, want_losses, want_eval = await _run(system, Trainer, None, 1)
        many, losses, evaluation = await _run(system, cls, options, n)
        assert want_losses[-1] < want_losses[0]
        np.testing.assert_allclose(losses, want_losses, rtol=2e-5, atol=1e-6)
        weights = await many.ask(GetWeights())
        np.testing.assert_allclose(weights, await single.ask(GetWeights()), rtol=2e-4, atol=2e-6)
        assert evaluation.samples == BATCH and evaluation.accuracy == want_eval.accuracy
        x, y = _batches(1)[0]
        per_token = np.zeros((BATCH, T), dtype=np.int64)
        for message in (Step(x, per_token), Evaluate(x, per_token), Step(x, y[:-1])):
            with pytest.raises(InvalidBatchError, match=rf"shape \({BATCH},\)"):
                await many.ask(message)
        np.testing.assert_array_equal(await many.ask(GetWeights()), weights)
