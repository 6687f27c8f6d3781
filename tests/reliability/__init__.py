"""Fault injection, crash-safe checkpoints, fuzzing and untrusted-data checks."""
