"""The functional core stays pure: `quota/` never imports the shell or any I/O library.

The contract lives in pyproject.toml ([tool.importlinter]); these tests run the real
import-linter against it, and show once that the check does fail on a violation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _run_lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": ""},
        check=False,
    )


def test_quota_core_imports_nothing_from_the_shell() -> None:
    result = _run_lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_contract_forbids_the_io_libraries_the_design_names() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = config["tool"]["importlinter"]["contracts"]
    assert contract["source_modules"] == ["quota"]
    assert {"controllers", "kubernetes", "sqlalchemy", "psycopg", "socket"} <= set(
        contract["forbidden_modules"]
    )


def test_check_fails_when_quota_imports_kubernetes(tmp_path: Path) -> None:
    # A copy of the tree with one offending line added to the core.
    shutil.copytree(
        REPO / "quota", tmp_path / "quota", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        REPO / "controllers", tmp_path / "controllers", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _run_lint(tmp_path).returncode == 0
    (tmp_path / "quota" / "offender.py").write_text("import kubernetes\n")
    result = _run_lint(tmp_path)
    assert result.returncode != 0
    assert "quota.offender -> kubernetes" in result.stdout
