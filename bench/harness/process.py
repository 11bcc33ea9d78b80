"""A child process a benchmark starts (a controller under test): its log, its state, what it
costs (CPU seconds and peak RSS of it and its descendants), and stopping it politely
(SIGTERM, then SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from bench.harness import meter


class Process:
    def __init__(
        self, name: str, argv: list[str], log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check(self) -> None:
        """Raise, with the end of its log, if it has exited."""
        if not self.alive():
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{tail}")

    def cpu_seconds(self) -> float:
        """CPU seconds of it and its descendants (a controller's webhook server is one)."""
        return meter.tree_cpu_seconds(self.pid)

    def reset_peak_rss(self) -> None:
        """From now on, `peak_rss` is the peak of what comes after (one scenario's own)."""
        meter.reset_peak_rss(self.pid)

    def peak_rss(self) -> int:
        """Bytes: the sum of its and its descendants' peaks."""
        return meter.tree_peak_rss(self.pid)

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 30) -> None:
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
