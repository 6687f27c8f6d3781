"""`warmup_command`: what `atomr warmup` prints while it compiles."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from numba.core import config

from atomr.accel.kernels import elementwise
from atomr.accel.kernels._compile import cache_dir_of
from atomr.train.core.warmup import WarmupPart, warm_up

__all__ = ["warmup_command"]


def warmup_command() -> int:
    """Compile and cache every training kernel, one line per part, and say
    on stderr when numba could not cache them where asked; returns 0 (a
    cache that cannot be written slows the next run down, it does not fail)."""
    started = time.perf_counter()
    print("atomr warmup: compiling the training kernels (cached on disk for every later run)")

    def report(part: WarmupPart) -> None:
        what = f"{part.compiled} compiled" if part.compiled else "all cached already"
        print(f"  {part.name}: {part.seconds:.1f} s ({what})", flush=True)

    parts = warm_up(report)
    total = sum(p.compiled for p in parts)
    print(
        f"atomr warmup: done in {time.perf_counter() - started:.1f} s, {total} kernel(s) compiled"
    )
    problem = _cache_problem()
    if problem is not None:
        print(f"atomr warmup: {problem}", file=sys.stderr)
    return 0


def _cache_problem() -> str | None:
    """What went wrong with numba's disk cache, or None when the kernels are
    cached in ``NUMBA_CACHE_DIR`` (or numba's default place when it is unset)."""
    where = cache_dir_of(elementwise.axpy_cpu)  # every CPU twin is cached in one place
    wanted: str = getattr(config, "CACHE_DIR", "")  # NUMBA_CACHE_DIR, as numba read it
    if where is None:
        folder = wanted or "__pycache__ beside atomr's kernels"
        return (
            f"warning: nothing was cached: numba cannot write to {folder} (nor to"
            " its fallbacks), so the next run will compile them again; make it"
            " writable or set NUMBA_CACHE_DIR to a folder that is"
        )
    if wanted and not Path(where).is_relative_to(Path(wanted)):
        return f"NUMBA_CACHE_DIR={wanted} cannot be written; numba cached the kernels in {where}"
    return None
