"""Data parallel: one model replicated on N devices, gradients all-reduced
(see docs/data_parallel.md)."""
