"""Character-level text with no download: the Python documentation that
ships with the interpreter (`pydoc_data.topics`, about 465 k characters).

`CharVocab` maps characters to ids; `char_lm_split` cuts the text into
non-overlapping windows of `context + 1` characters, each giving the inputs
`ids[:-1]` and the next-character labels `ids[1:]`, and holds out the last
`validation` fraction of the text (a contiguous tail: no window of it
overlaps training text). `generate` samples text from a trained model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from atomr.train.core.model.sequential import Sequential

__all__ = ["CharVocab", "char_lm_split", "generate", "pydoc_text"]


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
        chars: the characters.
    """

    chars: str

    @classmethod
    def of(cls, text: str) -> CharVocab:
        """The vocabulary of `text`."""
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """The ids of `text` (int64).

        Raises:
            ValueError: a character outside the vocabulary.
        """
        index = {c: i for i, c in enumerate(self.chars)}
        try:
            return np.array([index[c] for c in text], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`."""
        return "".join(self.chars[int(i)] for i in ids)


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
        ValueError: a context below 1, a fraction outside (0, 1), or a text
            too short for one window on each side.
    """
    if context < 1 or not 0.0 < validation < 1.0:
        raise ValueError(f"need context >= 1 and 0 < validation < 1, got {context}, {validation}")
    vocab = CharVocab.of(text)
    ids = vocab.encode(text)
    cut = int(len(ids) * (1.0 - validation))
    if cut <= context + 1 or len(ids) - cut <= context + 1:
        raise ValueError(f"a text of {len(ids)} characters is too short for context {context}")
    x_train, y_train = _windows(ids[:cut], context)
    x_val, y_val = _windows(ids[cut:], context)
    return x_train, y_train, x_val, y_val, vocab


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

    Raises:
        ValueError: an empty prompt, a character outside the vocabulary, or
            a temperature that is not positive.
    """
    if not prompt or not temperature > 0:
        raise ValueError("generate needs a prompt and a positive temperature")
    rng = np.random.default_rng(seed)
    ids = list(vocab.encode(prompt))
    window = model.in_shape[0]
    for _ in range(length):
        history = ids[-window:]
        x = np.zeros((1, window), dtype=np.int64)
        x[0, : len(history)] = history
        logits = np.asarray(model.backend.to_host(model.forward(model.backend.to_device(x))))
        row = logits[0, len(history) - 1].astype(np.float64) / temperature
        p = np.exp(row - row.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(ids[len(prompt) :])
