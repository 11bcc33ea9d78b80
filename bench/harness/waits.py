"""Polling until a condition holds: the one wait every benchmark does, with and without a
deadline that is an error."""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable


def wait_until(check: Callable[[], bool], timeout: float, every: float = 0.5) -> bool:
    """Poll `check` every `every` seconds until it holds (True) or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def wait_for(what: str, check: Callable[[], bool], timeout: float, every: float = 0.5) -> None:
    """`wait_until`, where running out of time is an error (TimeoutError naming `what`)."""
    if not wait_until(check, timeout, every):
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def wait_or_warn(what: str, check: Callable[[], bool], timeout: float, every: float = 0.2) -> bool:
    """`wait_until`, where running out of time is a warning on stderr: the figures measured so
    far are still reported."""
    if wait_until(check, timeout, every):
        return True
    print(f"warning: timed out waiting for {what}", file=sys.stderr)
    return False


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 now (a readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
