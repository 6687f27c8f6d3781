"""`warmup_command`: what `atomr warmup` prints while it compiles."""

from __future__ import annotations

import time

from atomr.train.core.warmup import WarmupPart, warm_up

__all__ = ["warmup_command"]


def warmup_command() -> int:
    """Compile and cache every training kernel, one line per part; returns 0."""
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
    return 0
