"""NumPy transcriptions of torch.nn.functional losses and torch.optim algorithms.

Written from the published formulas (torch docs, "Algorithm" sections),
independent of atomr's kernels. SGD evaluates each update in float64 and
rounds once on store; Adam follows torch's op order with every op in the
parameters' dtype, as torch.optim.Adam does for float32 parameters.
"""

from __future__ import annotations

import numpy as np


def ref_mse(y: np.ndarray, t: np.ndarray) -> tuple[float, np.ndarray]:
    """F.mse_loss(y, t), reduction='mean', and its gradient."""
    d = y.astype(np.float64) - t
    return float(np.mean(d * d)), 2.0 * d / d.size


def ref_cross_entropy(
    z: np.ndarray, labels: np.ndarray, weight: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
    """F.cross_entropy(z, labels, weight=weight), reduction='mean', and its gradient.

    loss_i = -w[y_i] * log_softmax(z_i)[y_i]; mean = sum_i loss_i / sum_i w[y_i].
    """
    z = z.astype(np.float64)
    n = z.shape[0]
    w = np.ones(z.shape[1]) if weight is None else np.asarray(weight, dtype=np.float64)
    shifted = z - z.max(axis=1, keepdims=True)
    log_sm = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    wi = w[labels]
    value = float(-(wi * log_sm[np.arange(n), labels]).sum() / wi.sum())
    onehot = np.zeros_like(z)
    onehot[np.arange(n), labels] = 1.0
    grad = wi[:, None] * (np.exp(log_sm) - onehot) / wi.sum()
    return value, grad


class RefSGD:
    """torch.optim.SGD, algorithm as published (maximize=False)."""

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        self.p = params
        self.lr, self.mu, self.tau, self.wd, self.nesterov = (
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        )
        self.b = None

    def step(self, g):
        p = self.p.astype(np.float64)
        g = g.astype(np.float64)
        if self.wd != 0:
            g = g + self.wd * p
        if self.mu != 0:
            if self.b is None:
                b = g.copy()
            else:
                b = self.mu * self.b.astype(np.float64) + (1 - self.tau) * g
            g = g + self.mu * b if self.nesterov else b
            self.b = b.astype(self.p.dtype)
        self.p[:] = p - self.lr * g


class RefAdam:
    """torch.optim.Adam (decoupled=False) / AdamW (decoupled=True), amsgrad=False."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False):
        self.p = params
        self.lr, self.b1, self.b2, self.eps, self.wd, self.decoupled = (
            lr,
            betas[0],
            betas[1],
            eps,
            weight_decay,
            decoupled,
        )
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0

    def step(self, g):
        # torch's _single_tensor_adam: every op in the parameters' dtype.
        self.t += 1
        dt = self.p.dtype.type
        p, g = self.p, g.astype(self.p.dtype)
        if self.decoupled:
            p *= dt(1 - self.lr * self.wd)
        elif self.wd != 0:
            g = g + dt(self.wd) * p
        self.m = dt(self.b1) * self.m + dt(1 - self.b1) * g
        self.v = dt(self.b2) * self.v + dt(1 - self.b2) * g * g
        bc1 = 1 - self.b1**self.t
        bc2 = 1 - self.b2**self.t
        step_size = self.lr / bc1
        denom = np.sqrt(self.v) / dt(bc2**0.5) + dt(self.eps)
        p -= dt(step_size) * (self.m / denom)
