"""Pipeline parallel: the model cut into stages, micro-batches scheduled
GPipe or 1F1B (see docs/pipeline_parallel.md)."""
