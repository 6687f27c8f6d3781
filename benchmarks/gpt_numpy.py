"""A GPT training step written in plain NumPy (float32, batched BLAS): the
reference `benchmarks/gpt.py` times atomr against.

The same architecture and parameter layout as `atomr.train.core.model.gpt`
(pre-LayerNorm blocks, causal attention, tanh-GELU MLP, mean cross-entropy
over every token) and the same AdamW update, on one flat vector.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

GELU_K = math.sqrt(2.0 / math.pi)


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, Any]:
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    xhat = (x - mean) * rstd
    return xhat * g + b, (xhat, rstd)


def _ln_back(
    dy: np.ndarray, g: np.ndarray, saved: Any, dg: np.ndarray, db: np.ndarray
) -> np.ndarray:
    xhat, rstd = saved
    dg[...] = (dy * xhat).reshape(-1, g.size).sum(0)
    db[...] = dy.reshape(-1, g.size).sum(0)
    gx = dy * g
    return rstd * (gx - gx.mean(-1, keepdims=True) - xhat * (gx * xhat).mean(-1, keepdims=True))


class NumpyGpt:
    """Views of one flat vector as the GPT's arrays, and a step over them."""

    def __init__(
        self, flat: np.ndarray, vocab: int, context: int, n_layer: int, n_head: int, d: int
    ) -> None:
        self.vocab, self.t, self.layers, self.h, self.d = vocab, context, n_layer, n_head, d
        self.flat = flat

    def views(self, vector: np.ndarray) -> list[np.ndarray]:
        """The arrays, in storage order, as views of `vector`."""
        d, shapes = self.d, [(self.vocab, self.d), (self.t, self.d)]
        for _ in range(self.layers):
            shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]
            shapes += [(d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
        shapes += [(d,), (d,), (d, self.vocab), (self.vocab,)]
        out, at = [], 0
        for s in shapes:
            n = int(np.prod(s))
            out.append(vector[at : at + n].reshape(s))
            at += n
        return out

    def _attention(self, x: np.ndarray, w: list[np.ndarray]) -> tuple[np.ndarray, Any]:
        b, t, d = x.shape
        dh = d // self.h
        qkv = x @ w[0] + w[1]
        q, k, v = (
            qkv[..., i * d : (i + 1) * d].reshape(b, t, self.h, dh).transpose(0, 2, 1, 3)
            for i in range(3)
        )
        s = (q @ k.transpose(0, 1, 3, 2)) * np.float32(1 / math.sqrt(dh))
        s[..., ~np.tril(np.ones((t, t), dtype=bool))] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return o @ w[2] + w[3], (x, q, k, v, p, o)

    def _attention_back(
        self, dy: np.ndarray, w: list[np.ndarray], g: list[np.ndarray], saved: Any
    ) -> np.ndarray:
        x, q, k, v, p, o = saved
        b, t, d = x.shape
        dh = d // self.h
        g[2][...] = o.reshape(-1, d).T @ dy.reshape(-1, d)
        g[3][...] = dy.reshape(-1, d).sum(0)
        do = (dy @ w[2].T).reshape(b, t, self.h, dh).transpose(0, 2, 1, 3)
        dv = p.transpose(0, 1, 3, 2) @ do
        dp = do @ v.transpose(0, 1, 3, 2)
        ds = p * (dp - (p * dp).sum(-1, keepdims=True)) * np.float32(1 / math.sqrt(dh))
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([a.transpose(0, 2, 1, 3).reshape(b, t, d) for a in (dq, dk, dv)], -1)
        g[0][...] = x.reshape(-1, d).T @ dqkv.reshape(-1, 3 * d)
        g[1][...] = dqkv.reshape(-1, 3 * d).sum(0)
        return dqkv @ w[0].T

    def loss_and_grad(self, ids: np.ndarray, labels: np.ndarray, grads: np.ndarray) -> float:
        """The mean loss; its gradient into `grads` (the flat layout)."""
        w, g = self.views(self.flat), self.views(grads)
        h, tapes = w[0][ids] + w[1][: ids.shape[1]], []
        for i in range(self.layers):
            p = w[2 + 12 * i : 14 + 12 * i]
            a, s1 = _ln(h, p[0], p[1])
            att, s2 = self._attention(a, p[2:6])
            h = h + att
            m, s3 = _ln(h, p[6], p[7])
            z = m @ p[8] + p[9]
            u = GELU_K * (z + 0.044715 * z**3)
            th = np.tanh(u)
            h = h + (0.5 * z * (1 + th)) @ p[10] + p[11]
            tapes.append((s1, s2, s3, m, z, th))
        f, sf = _ln(h, w[-4], w[-3])
        logits = f @ w[-2] + w[-1]
        logits -= logits.max(-1, keepdims=True)
        e = np.exp(logits)
        prob = e / e.sum(-1, keepdims=True)
        n = labels.size
        loss = float(-np.log(np.take_along_axis(prob, labels[..., None], -1)).mean())
        dlogits = prob
        np.put_along_axis(
            dlogits, labels[..., None], np.take_along_axis(prob, labels[..., None], -1) - 1, -1
        )
        dlogits /= n
        g[-2][...] = f.reshape(-1, self.d).T @ dlogits.reshape(-1, self.vocab)
        g[-1][...] = dlogits.reshape(-1, self.vocab).sum(0)
        dh = _ln_back(dlogits @ w[-2].T, w[-4], sf, g[-4], g[-3])
        for i in reversed(range(self.layers)):
            p, q = w[2 + 12 * i : 14 + 12 * i], g[2 + 12 * i : 14 + 12 * i]
            s1, s2, s3, m, z, th = tapes[i]
            gelu = 0.5 * z * (1 + th)
            q[10][...] = gelu.reshape(-1, 4 * self.d).T @ dh.reshape(-1, self.d)
            q[11][...] = dh.reshape(-1, self.d).sum(0)
            dgelu = dh @ p[10].T
            dz = dgelu * (
                0.5 * (1 + th) + 0.5 * z * (1 - th**2) * GELU_K * (1 + 3 * 0.044715 * z**2)
            )
            q[8][...] = m.reshape(-1, self.d).T @ dz.reshape(-1, 4 * self.d)
            q[9][...] = dz.reshape(-1, 4 * self.d).sum(0)
            dh = dh + _ln_back(dz @ p[8].T, p[6], s3, q[6], q[7])
            da = self._attention_back(dh, p[2:6], q[2:6], s2)
            dh = dh + _ln_back(da, p[0], s1, q[0], q[1])
        g[0][...] = 0
        np.add.at(g[0], ids.reshape(-1), dh.reshape(-1, self.d))
        g[1][...] = 0
        g[1][: ids.shape[1]] = dh.sum(0)
        return loss


def adamw(
    flat: np.ndarray, grads: np.ndarray, m: np.ndarray, v: np.ndarray, step: int, lr: float
) -> None:
    """torch's AdamW (betas 0.9, 0.999, eps 1e-8, weight decay 0.01), in place."""
    flat *= np.float32(1 - lr * 0.01)
    m *= np.float32(0.9)
    m += np.float32(0.1) * grads
    v *= np.float32(0.999)
    v += np.float32(0.001) * grads * grads
    mhat = m / np.float32(1 - 0.9**step)
    vhat = v / np.float32(1 - 0.999**step)
    flat -= np.float32(lr) * mhat / (np.sqrt(vhat) + np.float32(1e-8))
