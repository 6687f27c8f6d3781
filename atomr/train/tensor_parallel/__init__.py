"""Tensor parallel: each layer split across shards, Megatron-LM's column/row
pairing (see docs/tensor_parallel.md)."""
