"""The asynchronous parameter server: server shards hold the weights, workers
pull, compute and push gradients (see docs/parameter_server.md)."""
