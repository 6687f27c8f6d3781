"""A second Ctrl-C ends the process at once, even when a non-daemon thread
is stuck (as in numba's compile lock) and the run would never stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

_STUCK_RUN = textwrap.dedent(
    """
    import asyncio, threading
    from atomr.cli.interrupt import stop_on_signals
    from atomr.train.fit import StopFlag

    held = threading.Lock()
    held.acquire()
    threading.Thread(target=held.acquire).start()  # non-daemon, blocked forever

    async def main():
        flag = StopFlag()
        with stop_on_signals(flag, []):
            print("ready", flush=True)
            while not flag.requested:
                await asyncio.sleep(0.01)
            print("stopping", flush=True)
            await asyncio.Event().wait()  # the step in flight never ends

    asyncio.run(main())
    """
)


def test_a_second_ctrl_c_ends_a_stuck_process() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_RUN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "stopping\n"  # the first Ctrl-C only asked to stop
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # a deadline: it hangs forever when broken
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGINT, err
    assert "press Ctrl-C again to quit at once" in err
    assert "Traceback" not in err
