"""The README's cluster-free section, followed literally: every command in its shell blocks
(simulate, fairshare, admit, import) runs from a fresh shell in the repository and succeeds
with output and no traceback. The sections that need a cluster have their own e2e tests
(tests/e2e/test_readme_e2e.py, tests/e2e/test_up_e2e.py)."""

from __future__ import annotations

import re
import shlex
import subprocess

from tests.conftest import REPO

SECTION = "## Simulate a cluster before you change it"


def commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_section_has_the_commands_it_promises() -> None:
    words = " ".join(commands())
    for command in ("muster simulate", "muster fairshare", "muster admit", "muster import"):
        assert command in words


def test_the_readme_commands_work_when_typed_literally() -> None:
    # One shell for the whole section, as a reader types it: a later line may read what an
    # earlier one wrote (import -o, then fairshare of its output). Each line announces itself
    # so that a failure names the line.
    script = ["set -euo pipefail"]
    for line in commands():
        script += [f"echo {shlex.quote('>>> ' + line)} >&2", line]
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    ran = [line[4:] for line in result.stderr.splitlines() if line.startswith(">>> ")]
    assert result.returncode == 0, f"failed at: {ran[-1:]}\n" + result.stderr[-3000:]
    assert ran == commands()
    assert "Traceback" not in result.stderr
    assert "Fair share per queue" in result.stdout
