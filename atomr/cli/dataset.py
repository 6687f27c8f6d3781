"""`Dataset` and `load_dataset`: the train/test arrays of an `atomr train` run."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from atomr.cli.errors import CliError
from atomr.cli.run_config import RunConfig
from atomr.train.core import load_digits_split, synthetic_classification
from atomr.train.core.text import CharVocab, char_lm_split, pydoc_text

__all__ = ["Dataset", "data_digest", "load_dataset"]

_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Dataset:
    """A classification data set split into train and test parts.

    Attributes:
        name: "digits" or "synthetic".
        x_train, y_train: float32 features `(n, features)`, int64 labels `(n,)`
            (pydoc: int64 character ids and next characters, `(n, context)`).
        x_test, y_test: the held-out part, same layout.
        classes: number of classes (pydoc: characters).
        vocab: pydoc's characters (None for the others).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    vocab: CharVocab | None = None

    @property
    def features(self) -> int:
        """Input width."""
        return int(self.x_train.shape[1])


def load_dataset(run: RunConfig) -> Dataset:
    """Load the data set named by `run.dataset`.

    pydoc is the Python documentation that ships with the interpreter, as
    `--context`-character windows (the last tenth held out); digits is scikit-learn's bundled 8x8 digits (1797 samples, no download;
    a quarter held out); synthetic is `run.samples` Gaussian blobs with
    `run.features` features and `run.classes` classes (a fifth held out),
    both shuffled with `run.seed`.

    Raises:
        CliError: scikit-learn is missing (digits), this Python has no
            `pydoc_data` (pydoc; exit status 1), or the text is too short for
            `--context` (`--samples` too few to split is refused with the
            options: `run_args.MIN_SAMPLES`).
    """
    if run.dataset == "pydoc":
        assert run.gpt is not None
        try:
            text = pydoc_text()
        except ImportError:
            raise CliError(
                "--dataset pydoc: this Python ships without its documentation (pydoc_data): "
                "install a full Python, or train another --dataset",
                1,
            ) from None
        try:
            x_tr, y_tr, x_te, y_te, vocab = char_lm_split(text, run.gpt.context)
        except ValueError as exc:  # a --context longer than the text can hold out
            raise CliError(f"--context {run.gpt.context}: {exc}") from None
        return Dataset("pydoc", x_tr, y_tr, x_te, y_te, len(vocab), vocab)
    if run.dataset == "digits":
        try:
            x_tr, y_tr, x_te, y_te = load_digits_split(seed=run.seed)
        except ImportError:
            raise CliError(
                "the digits data set needs scikit-learn: pip install -e '.[train]'", 1
            ) from None
        return Dataset("digits", x_tr, y_tr, x_te, y_te, 10)
    x, y = synthetic_classification(run.samples, run.features, run.classes, seed=run.seed)
    n_test = max(1, int(round(run.samples * _TEST_FRACTION)))
    return Dataset("synthetic", x[n_test:], y[n_test:], x[:n_test], y[:n_test], run.classes)


def data_digest(data: Dataset) -> str:
    """Which data `data` holds, in hex: the SHA-256 of its name, class count,
    vocabulary (pydoc) and every array's dtype, shape and bytes.

    The ranks of a `--distributed` job compare it: each loads the data set
    itself, and the same options can load other data on another host
    (pydoc from its Python's documentation, digits from its scikit-learn,
    synthetic from its numpy's generator). Reads every byte once (about a
    second per GB).
    """
    vocab = None if data.vocab is None else data.vocab.chars
    sha = hashlib.sha256(repr((data.name, data.classes, vocab)).encode())
    for array in (data.x_train, data.y_train, data.x_test, data.y_test):
        sha.update(repr((array.dtype.str, array.shape)).encode())
        sha.update(np.ascontiguousarray(array).data)
    return sha.hexdigest()
