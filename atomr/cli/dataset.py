"""`Dataset` and `load_dataset`: the train/test arrays of an `atomr train` run."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atomr.cli.errors import CliError
from atomr.cli.run_config import RunConfig
from atomr.train import load_digits_split, synthetic_classification

__all__ = ["Dataset", "load_dataset"]

_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Dataset:
    """A classification data set split into train and test parts.

    Attributes:
        name: "digits" or "synthetic".
        x_train, y_train: float32 features `(n, features)`, int64 labels `(n,)`.
        x_test, y_test: the held-out part, same layout.
        classes: number of classes.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    @property
    def features(self) -> int:
        """Input width."""
        return int(self.x_train.shape[1])


def load_dataset(run: RunConfig) -> Dataset:
    """Load the data set named by `run.dataset`.

    digits is scikit-learn's bundled 8x8 digits (1797 samples, no download;
    a quarter held out); synthetic is `run.samples` Gaussian blobs with
    `run.features` features and `run.classes` classes (a fifth held out),
    both shuffled with `run.seed`.

    Raises:
        CliError: scikit-learn is missing, or the set is too small to split.
    """
    if run.dataset == "digits":
        try:
            x_tr, y_tr, x_te, y_te = load_digits_split(seed=run.seed)
        except ImportError:
            raise CliError(
                "the digits data set needs scikit-learn: pip install -e '.[train]'", 1
            ) from None
        return Dataset("digits", x_tr, y_tr, x_te, y_te, 10)
    if run.samples < 10:
        raise CliError(f"--samples must be >= 10 to hold out a test set, got {run.samples}")
    x, y = synthetic_classification(run.samples, run.features, run.classes, seed=run.seed)
    n_test = max(1, int(round(run.samples * _TEST_FRACTION)))
    return Dataset("synthetic", x[n_test:], y[n_test:], x[:n_test], y[:n_test], run.classes)
