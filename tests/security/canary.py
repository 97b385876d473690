"""What a hostile pickle tries to call: running it leaves a mark a test can look for, in this
process (CALLS) or any other (a file named by NDSTORE_TEST_CANARY)."""

from __future__ import annotations

import os
from pathlib import Path

CALLS: list[tuple[object, ...]] = []


def touch(*args: object) -> str:
    CALLS.append(args)
    marker = os.environ.get("NDSTORE_TEST_CANARY")
    if marker:
        Path(marker).write_text("code ran\n")
    return "touched"
