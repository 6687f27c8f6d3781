"""Dropout with a mask that is a function of (seed, step, sample, position).

An element is kept when `hash(seed, step, sample, position) / 2**32 >= p`;
kept elements are scaled by `1 / (1 - p)`. `sample` is the element's row in
the *whole* batch (`sample_offset` + its row in this call) and `position`
its index inside the sample, so a replica, a micro-batch or a shard that
holds rows `lo:hi` of a batch draws exactly the mask one device draws for
those rows: every strategy equals one device. The hash is a 32-bit integer
mix (no state, no random generator to carry), computed again in the
backward pass, which applies the same mask to the gradient.

A kept element is ``float64(x) * scale`` rounded once to y's dtype: what
compiled code computes for a float32 x times the float64 scale, said
explicitly for the CUDA simulator, where NumPy 2 would round the scale to
float32 first (a result one ulp off in about half the elements).
"""

from __future__ import annotations

from typing import Any

from numba import float64

from atomr.accel.kernels._compile import (
    cpu_loop,
    cpu_scalar,
    cuda,
    gpu_kernel,
    gpu_scalar,
    launch_1d,
)

__all__ = ["dropout_cpu", "dropout_cuda"]

_MASK32 = 0xFFFFFFFF


def _mix(x):
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def _element_with(mix: Any) -> Any:
    """The per-element function, over the CPU or the CUDA compilation of `_mix`."""

    def element(x, y, per_sample, sample_offset, step, seed, p, scale, idx):
        sample = sample_offset + idx // per_sample
        position = idx - (idx // per_sample) * per_sample
        h = mix(seed & _MASK32)
        h = mix((h ^ (step & _MASK32)) & _MASK32)
        h = mix((h ^ (sample & _MASK32)) & _MASK32)
        h = mix((h ^ (position & _MASK32)) & _MASK32)
        if h * 2.3283064365386963e-10 >= p:  # h / 2**32
            y[idx] = float64(x[idx]) * scale
        else:
            y[idx] = 0.0

    return element


_element_cpu = cpu_scalar(_element_with(cpu_scalar(_mix)))
_element_gpu = gpu_scalar(_element_with(gpu_scalar(_mix)))


@cpu_loop
def dropout_cpu(x, y, per_sample, sample_offset, step, seed, p, scale):
    """y = x * mask * scale on flat arrays (x may be y); the mask as the module says."""
    for idx in range(x.shape[0]):
        _element_cpu(x, y, per_sample, sample_offset, step, seed, p, scale, idx)


@gpu_kernel
def _dropout_kernel(x, y, per_sample, sample_offset, step, seed, p, scale):
    idx = cuda.grid(1)
    while idx < x.shape[0]:
        _element_gpu(x, y, per_sample, sample_offset, step, seed, p, scale, idx)
        idx += cuda.gridsize(1)


def dropout_cuda(
    x: Any,
    y: Any,
    per_sample: int,
    sample_offset: int,
    step: int,
    seed: int,
    p: float,
    scale: float,
) -> None:
    """The CUDA twin of `dropout_cpu` (a thread per element, grid-stride)."""
    launch_1d(_dropout_kernel, x.shape[0], x, y, per_sample, sample_offset, step, seed, p, scale)
