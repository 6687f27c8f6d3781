"""The shared empty containers an actor cell starts with.

Most actors never watch, are never watched, never defer a reply, never start a
task and never stash. Their cells share these immutable empties instead of
allocating a set or list each; the first write replaces one with the real
container. Fewer objects per actor means less work for the cyclic garbage
collector, whose passes over many live actors cost whatever runs next.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NONE"]

NONE: frozenset[Any] = frozenset()
"""The empty set of watchers, watched actors, deferred replies or tasks."""
