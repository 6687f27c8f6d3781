"""Run under `mpiexec -n N`: a rank whose launcher may be SIGKILLed.

argv: OUT_DIR. Each rank makes an `MpiCollective` (which watches the launcher),
writes `up{rank}` (its pid) into OUT_DIR, then waits up to 120 s for nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from atomr.train.comm.mpi.collective import MpiCollective


def main(out: Path) -> None:
    collective = MpiCollective(timeout=30.0)
    (out / f"up{collective.rank}").write_text(str(os.getpid()))
    threading.Event().wait(120)  # outlives the test's deadline unless the watchdog ends it


if __name__ == "__main__":
    main(Path(sys.argv[1]))
