"""Where a process tree's CPU goes, sampled from outside with py-spy (`pip install py-spy`):
per process (Muster's controller and its webhook server), per thread (by name, serial
numbers dropped) and per activity (decoding JSON, freezing watch events into the caches,
HTTP and TLS, ...): each sample counts for the activity of the innermost frame of its stack
that matches one, or for "other", so the activities add up to the whole.

py-spy leaves out threads it sees idle, but not all of them: a thread blocked in
`Condition.wait`, an executor's queue or a socket read waiting for the apiserver's answer
often counts as running (most of the samples of the controller's stream run). Samples
whose innermost frame is such a wait are counted apart (`idle`) and left out of the shares;
the rest are shares of CPU time, which `Breakdown.seconds` turns into CPU seconds given the
tree's measured total.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.meter import cpu_seconds_of, peak_rss_of, thread_group, tree

# Activity -> frame fragments (a function name and its file, as py-spy prints a frame:
# "name (path/file.py:line)"). The innermost matching frame decides: a TLS read inside the
# Kubernetes client's pydantic-validated call is HTTP and TLS, not pydantic.
ACTIVITIES: Mapping[str, tuple[str, ...]] = {
    "decoding JSON": ("JSONDecoder.", "loads (json/", "loads (orjson"),
    "encoding JSON": ("JSONEncoder.", "dumps (json/"),
    "freezing watch events into the caches": ("(controllers/runtime/frozen.py",),
    "the informers (watching, caching)": ("(controllers/runtime/informer.py",),
    "HTTP and TLS (API calls)": ("(urllib3/", "(http/client.py", "(ssl.py"),
    "the Kubernetes client's (de)serialization": ("ApiClient.sanitize", "ApiClient.deserial"),
    "pydantic (API models)": ("(pydantic/", "(pydantic_core"),
    "the admission cycle's decisions (quota/)": ("(quota/",),
    "the admission view (controllers/admission/view.py)": ("(controllers/admission/view.py",),
    "status and decision writes (controllers/admission/writer.py)": (
        "(controllers/admission/writer.py",
    ),
    "the history (spool, store)": ("(controllers/history/",),
    "Events": ("(controllers/runtime/events.py",),
    "logging": ("(logging/",),
    "Prometheus metrics": ("(prometheus_client/",),
    "the webhook server's requests": ("(controllers/webhooks/",),
}
# Innermost frames of a thread that waits (sampled as running all the same).
WAITS = (
    "Condition.wait (threading.py",
    "Event.wait (threading.py",
    "_worker (concurrent/futures/thread.py",
    "get (queue.py",
    "select (selectors.py",
    "SSLSocket.read (ssl.py",  # an API call waiting for its answer
    "do_poll (urllib3/util/wait.py",
)
_LINE = re.compile(
    r'^process \d+:"(?P<cmd>[^"]*)";thread \(\d+\): (?P<thread>[^;]*);?'
    r"(?P<stack>.*) (?P<n>\d+)$"
)


def process_role(cmd: str) -> str:
    """Which of Muster's processes a command line is."""
    if "controllers.webhooks.process" in cmd:
        return "webhook server"
    if "controller" in cmd:
        return "controller"
    return cmd.split()[0] if cmd else "?"


def usage_by_role(pid: int) -> dict[str, tuple[float, int]]:
    """(CPU seconds, peak RSS bytes) of each process of the tree, by role (/proc, no
    sampling: always cheap)."""
    out: dict[str, tuple[float, int]] = {}
    for member in tree(pid):
        with contextlib.suppress(OSError, ValueError):
            proc = Path(f"/proc/{member}")
            role = process_role(proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode())
            cpu = cpu_seconds_of(proc.joinpath("stat").read_text(), children=False)
            peak = peak_rss_of(proc.joinpath("status").read_text())
            before = out.get(role, (0.0, 0))
            out[role] = (before[0] + cpu, before[1] + peak)
    return out


def usage_since(pid: int, before: Mapping[str, tuple[float, int]]) -> dict[str, dict[str, float]]:
    """Each role's CPU seconds since `before` (a `usage_by_role`) and its peak RSS (MiB)
    since the peaks were last reset."""
    now = usage_by_role(pid)
    return {
        role: {
            "cpu_seconds": round(cpu - before.get(role, (0.0, 0))[0], 1),
            "peak_rss_mib": round(peak / 2**20),
        }
        for role, (cpu, peak) in sorted(now.items())
    }


@dataclass(frozen=True)
class Breakdown:
    """Samples per process role, per thread group and per activity."""

    samples: int = 0  # not counting `idle`
    idle: int = 0
    processes: Mapping[str, int] = field(default_factory=dict)
    threads: Mapping[str, int] = field(default_factory=dict)
    activities: Mapping[str, int] = field(default_factory=dict)

    def seconds(self, cpu_seconds: float) -> dict[str, Any]:
        """Each share as CPU seconds of `cpu_seconds` (the tree's measured total), largest
        first, and the number of samples they come from."""

        def share(counts: Mapping[str, int]) -> dict[str, float]:
            if not self.samples:
                return {}
            ranked = sorted(counts.items(), key=lambda kv: -kv[1])
            return {k: round(cpu_seconds * n / self.samples, 2) for k, n in ranked}

        return {
            "samples": self.samples,
            "idle_samples": self.idle,
            "by_process": share(self.processes),
            "by_thread": share(self.threads),
            "by_activity": share(self.activities),
        }


def parse(text: str) -> Breakdown:
    """py-spy's raw output (`record --format raw --threads --subprocesses`)."""
    processes: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    activities: Counter[str] = Counter()
    samples = idle = 0
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match is None:
            continue
        n = int(match["n"])
        frames = match["stack"].split(";")
        if any(frames[-1].startswith(w) for w in WAITS):
            idle += n
            continue
        samples += n
        role = process_role(match["cmd"])
        processes[role] += n
        threads[f"{role}: {thread_group(match['thread'].strip())}"] += n
        activities[activity_of(frames)] += n
    return Breakdown(samples, idle, dict(processes), dict(threads), dict(activities))


def activity_of(frames: list[str]) -> str:
    """The activity of the innermost frame (the last) that matches one, else "other"."""
    for frame in reversed(frames):
        for activity, fragments in ACTIVITIES.items():
            if any(f in frame for f in fragments):
                return activity
    return "other"


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    return found


class Spy:
    """py-spy recording one process tree from `start` to `stop`."""

    def __init__(self, pid: int, out: Path, rate: int = 50) -> None:
        self.pid, self.out, self.rate = pid, out, rate
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [py_spy(), "record", "--pid", str(self.pid), "--subprocesses", "--threads"]
        argv += ["--nonblocking", "--format", "raw", "-r", str(self.rate), "-o", str(self.out)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> Breakdown:
        """Stop sampling (py-spy writes its file on SIGINT) and read what it wrote."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return parse(self.out.read_text()) if self.out.exists() else Breakdown()
