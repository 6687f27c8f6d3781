"""Data sets shared by the trainers, the CLI, the tests and the benchmarks."""

from __future__ import annotations

import numpy as np

from atomr._arguments import array_bytes, building, int_at_least, real_number

__all__ = ["epoch_order", "load_digits_split", "synthetic_classification"]


def load_digits_split(
    seed: int = 0, test_fraction: float = 0.25
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load scikit-learn's bundled 8x8 digits (1797 samples, 64 features,
    10 classes; no download) and split it into a shuffled train and test set.

    Features are scaled from the raw 0..16 range to [0, 1].

    Args:
        seed: seed of the shuffle (`np.random.default_rng(seed)`).
        test_fraction: share of the samples held out for testing, in (0, 1);
            rounded, but both sets keep at least one sample.

    Returns:
        `(x_train, y_train, x_test, y_test)`: float32 features of shape
        `(n, 64)` and int64 labels of shape `(n,)`.

    Raises:
        TypeError: `seed` is not an int or `test_fraction` not a number (a
            bool is neither).
        ValueError: `seed` is negative, or `test_fraction` not in (0, 1).
        ImportError: scikit-learn is not installed (`pip install -e '.[train]'`).
    """
    seed = int_at_least("seed", seed, 0, high=None)
    if not 0.0 < real_number("test_fraction", test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (np.asarray(digits.data, dtype=np.float32) / np.float32(16.0)).astype(np.float32)
    y = np.asarray(digits.target, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    # both sides keep at least one sample, whatever the fraction rounds to
    n_test = min(len(y) - 1, max(1, int(round(len(y) * test_fraction))))
    return (
        np.ascontiguousarray(x[n_test:]),
        np.ascontiguousarray(y[n_test:]),
        np.ascontiguousarray(x[:n_test]),
        np.ascontiguousarray(y[:n_test]),
    )


def synthetic_classification(
    n: int, features: int, classes: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A learnable synthetic classification set: one Gaussian blob per class.

    Each class has a random centre drawn from N(0, 1) in `features`
    dimensions; samples are that centre plus N(0, 0.5^2) noise.

    Args:
        n: number of samples (>= 1).
        features: input width (>= 1).
        classes: number of classes (>= 2).
        seed: seed of `np.random.default_rng`.

    Returns:
        `(x, y)`: float32 features `(n, features)` and int64 labels `(n,)`
        in `[0, classes)`.

    Raises:
        TypeError: a size or the seed is not an int (a bool is none).
        ValueError: a size is out of range (more samples or classes than
            an array holds included: `array_bytes`), or the seed negative.
        MemoryError: too many to hold in this machine's memory.
    """
    n, features = int_at_least("n", n), int_at_least("features", features)
    classes, seed = int_at_least("classes", classes, 2), int_at_least("seed", seed, 0, high=None)
    what = f"a synthetic set of {n} samples of {features} features"
    nbytes = array_bytes(what, n * features, 8)  # drawn in float64
    array_bytes(f"{classes} class centres of {features} features", classes * features, 8)
    rng = np.random.default_rng(seed)
    with building(what, nbytes):
        centres = rng.standard_normal((classes, features))
        y = rng.integers(0, classes, size=n, dtype=np.int64)
        x = centres[y] + 0.5 * rng.standard_normal((n, features))
        return x.astype(np.float32), y


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled sample order of `epoch` (0-based): `default_rng([seed,
    epoch]).permutation(n)`, a function of the seed and the epoch only, so a
    run resumed at an epoch sees the same order. Every epoch loop uses it
    (`atomr.train.fit`, the parameter server's `TrainEpochs`).

    Raises:
        TypeError: an argument that is not an int (a bool is none).
        ValueError: a negative one, or an `n` no array holds (`array_bytes`).
        MemoryError: an order too long for this machine's memory.
    """
    n, epoch = int_at_least("n", n, 0), int_at_least("epoch", epoch, 0)
    seed = int_at_least("seed", seed, 0, high=None)
    what = f"the order of {n} samples"
    with building(what, array_bytes(what, n, 8)):  # int64 indices
        return np.random.default_rng([seed, epoch]).permutation(n)
