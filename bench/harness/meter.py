"""CPU seconds and resident memory, read from /proc: of a process and its descendants (a
controller and its webhook server), of the local cluster's components, of this process's
threads, and of the kubectl processes this one ran and waited for."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import threading
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(stat: str, ticks_per_second: int = TICKS, children: bool = True) -> float:
    """User + system CPU seconds from the text of /proc/PID/stat; with `children`, those of
    its children that exited and were waited for (cutime, cstime) too."""
    # The command name (field 2) may hold spaces and parentheses; the rest follows the last ')'.
    # After it: state is field 3, utime 14, stime 15, cutime 16, cstime 17 (1-based).
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11 : 15 if children else 13]) / ticks_per_second


def status_bytes(status: str, field: str) -> int:
    """A memory figure (VmRSS, VmHWM, ...) in bytes from the text of /proc/PID/status."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) * 1024
    raise ValueError(f"no {field} line in /proc/PID/status")


def peak_rss_of(status: str) -> int:
    """Peak resident set size in bytes (VmHWM) from the text of /proc/PID/status."""
    return status_bytes(status, "VmHWM")


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process, MiB."""
    status = Path("/proc/self/status").read_text()
    return status_bytes(status, "VmRSS") / 2**20, status_bytes(status, "VmHWM") / 2**20


def tree(pid: int) -> list[int]:
    """The process and its descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of the process tree, children that exited (and were reaped) included."""
    total = 0.0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds_of(Path(f"/proc/{member}/stat").read_text())
    return total


def reset_peak_rss(pid: int) -> None:
    """Each process of the tree's peak RSS set back to its current RSS, so that the next
    reading is the peak of what came after."""
    for member in tree(pid):
        with contextlib.suppress(OSError):
            Path(f"/proc/{member}/clear_refs").write_text("5")  # "5": reset VmHWM (proc(5))


def tree_peak_rss(pid: int) -> int:
    """The sum of each process's peak RSS in the tree (at least the tree's peak), bytes."""
    total = 0
    for member in tree(pid):
        with contextlib.suppress(OSError, ValueError):
            total += peak_rss_of(Path(f"/proc/{member}/status").read_text())
    return total


def processes_cpu(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process (its own, not its children's)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            out[name] = cpu_seconds_of(Path(f"/proc/{pid}/stat").read_text(), children=False)
    return out


def thread_group(name: str) -> str:
    """A thread's name without its serial numbers ("worker-3" -> "worker")."""
    name = re.sub(r"Thread-\d+ ", "Thread ", name)
    return re.sub(r"([-_]\d+)+$", "", name)


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's live threads, by thread name group."""
    out: defaultdict[str, float] = defaultdict(float)
    for t in threading.enumerate():
        if t.native_id is None:
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/self/task/{t.native_id}/stat").read_text()
            out[thread_group(t.name)] += cpu_seconds_of(stat, children=False)
    return dict(out)


def children_cpu() -> float:
    """CPU seconds of this process's children that exited and were waited for (kubectl)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(usage.ru_utime + usage.ru_stime)
