"""Run the real kubectl against a kubeconfig: how tests and the CLI drive the cluster."""

from __future__ import annotations

import subprocess
from pathlib import Path


class KubectlError(RuntimeError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(
            f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
        )
        self.result = result


def kubectl(
    binary: str,
    kubeconfig: Path | str,
    *args: str,
    input: str | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    argv = [binary, "--kubeconfig", str(kubeconfig), *args]
    result = subprocess.run(
        argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise KubectlError(list(args), result)
    return result
