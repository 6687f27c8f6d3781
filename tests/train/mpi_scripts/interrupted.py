"""Run under `mpiexec -n N`: how a rank sees Ctrl-C on the launcher.

argv: OUT_DIR MODE. Each rank writes `up{rank}` (its pid) into OUT_DIR, then
waits up to 60 s, writing `got{rank}` (the count so far) on each SIGINT.
MODE "stop": the first SIGINT also makes it exit 130 (as `atomr train` does
after saving). MODE "ignore": it keeps waiting (a rank stuck in a long step).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main(out: Path, mode: str) -> None:
    rank = int(os.environ["PMI_RANK"])
    got: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    (out / f"up{rank}").write_text(str(os.getpid()))
    deadline, seen = time.monotonic() + 60, 0
    while time.monotonic() < deadline:
        if len(got) > seen:
            seen = len(got)
            (out / f"got{rank}").write_text(str(seen))
            if mode == "stop":
                sys.exit(130)
        time.sleep(0.02)  # a poll of `got` (filled by the handler), under the deadline


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
