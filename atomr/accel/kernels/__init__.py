"""Kernel families, each as a numba.cuda kernel and a CPU twin (see docs/devices.md)."""
