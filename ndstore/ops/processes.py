"""Running a group of service processes in the foreground: wait for a part to be ready, run until
a signal or until one of them exits, stop them in reverse order of start."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence


class StartFailed(RuntimeError):
    """Raised by a readiness check that knows waiting longer cannot help (a process exited)."""


def wait_until(check: object, what: str, timeout: float = 30.0, every_s: float = 0.1) -> None:
    """Poll `check()` every ``every_s`` until it is true; an exception from it means not yet, but
    StartFailed ends the wait at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except StartFailed:
            raise
        except Exception:  # noqa: BLE001 - the service is not up yet
            pass
        time.sleep(every_s)
    raise RuntimeError(f"{what} did not start within {timeout:.0f}s")


def on_stop_signal() -> Callable[[], bool]:
    """Catch SIGINT and SIGTERM from now on; the returned call says whether one arrived."""
    stop = {"signal": 0}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: stop.update(signal=s))
    return lambda: bool(stop["signal"])


def run_until_stopped(procs: Sequence[subprocess.Popen[bytes]], stopped: Callable[[], bool]) -> bool:
    """Block until a stop signal arrives (True) or one of `procs` exits (False)."""
    while not stopped() and all(p.poll() is None for p in procs):
        time.sleep(0.2)
    return stopped()


def stop_in_reverse(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Terminate each process, last started first, waiting for each before the next (killed past
    `timeout_s`)."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
