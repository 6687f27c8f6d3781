"""Run under `mpiexec -n N`: how a rank sees Ctrl-C on the launcher.

argv: OUT_DIR MODE. Each rank writes `up{rank}` (its pid) into OUT_DIR, then
waits up to 60 s. MODE "stop": the first SIGINT makes it write `got{rank}`
and exit 130 (as `atomr train` does after saving). MODE "ignore": it notes
SIGINTs and keeps waiting (a rank stuck in a long step).
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
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if got and mode == "stop":
            (out / f"got{rank}").write_text("SIGINT")
            sys.exit(130)
        time.sleep(0.02)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
