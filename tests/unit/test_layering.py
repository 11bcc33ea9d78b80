"""The functional core stays pure (`quota/` never imports the shell or any I/O library), and
no package anywhere has an import cycle, among its modules or among its sub-packages.

The contracts live in pyproject.toml ([tool.importlinter]); these tests run the real
import-linter against them, and show once for each that the check does fail on a violation.
"""

from __future__ import annotations

import ast
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


def test_core_is_pure_and_no_package_has_a_cycle() -> None:
    result = _run_lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_contract_forbids_the_io_libraries_the_design_names() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "forbidden"
    ]
    assert contract["source_modules"] == ["quota"]
    assert {"controllers", "kubernetes", "sqlalchemy", "psycopg", "socket"} <= set(
        contract["forbidden_modules"]
    )


def _copy_tree(tmp_path: Path) -> None:
    shutil.copytree(
        REPO / "quota", tmp_path / "quota", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        REPO / "controllers", tmp_path / "controllers", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")


def test_check_fails_when_quota_imports_kubernetes(tmp_path: Path) -> None:
    # A copy of the tree with one offending line added to the core.
    _copy_tree(tmp_path)
    assert _run_lint(tmp_path).returncode == 0
    (tmp_path / "quota" / "offender.py").write_text("import kubernetes\n")
    result = _run_lint(tmp_path)
    assert result.returncode != 0
    assert "quota.offender -> kubernetes" in result.stdout


def test_every_package_is_checked_for_cycles() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "acyclic_siblings"
    ]
    assert set(contract["ancestors"]) == {"quota", "controllers"}


def test_check_fails_on_an_import_cycle(tmp_path: Path) -> None:
    # Two modules of one shell package that import each other, one of them only inside a
    # function (the way a cycle likes to hide): the check must still see it.
    _copy_tree(tmp_path)
    room = tmp_path / "controllers" / "runtime"
    (room / "chicken.py").write_text("from controllers.runtime import egg\n")
    (room / "egg.py").write_text("def hatch():\n    from controllers.runtime import chicken\n")
    result = _run_lint(tmp_path)
    assert result.returncode != 0
    assert "No cycles are allowed in controllers.runtime" in result.stdout
    assert ".chicken" in result.stdout or ".egg" in result.stdout


def test_check_fails_on_a_cycle_between_packages(tmp_path: Path) -> None:
    # What `muster`'s group once did by a string: a module of cli/ naming `muster up`, whose
    # package imports cli/. Written as a plain import (inside a function, as a lazily loaded
    # command is), the check sees the loop between the two packages.
    _copy_tree(tmp_path)
    (tmp_path / "controllers" / "cli" / "group.py").write_text(
        "def up():\n    from controllers.up.command import up\n\n    return up\n"
    )
    result = _run_lint(tmp_path)
    assert result.returncode != 0
    assert "No cycles are allowed in controllers." in result.stdout
    assert ".cli -> .up" in result.stdout or ".up -> .cli" in result.stdout


def _imports_by_a_string(path: Path) -> list[int]:
    """The lines of `path` that import a module named by a string, which no import check sees."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in {"import_module", "__import__"}:
                lines.append(node.lineno)
    return lines


def test_no_module_is_imported_by_a_string() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for package in ("quota", "controllers")
        for path in sorted((REPO / package).rglob("*.py"))
        for line in _imports_by_a_string(path)
    ]
    assert found == []


def test_a_string_import_is_found(tmp_path: Path) -> None:
    offender = tmp_path / "offender.py"
    offender.write_text(
        "import importlib\n\n\ndef load():\n    return importlib.import_module('controllers.up')\n"
    )
    assert _imports_by_a_string(offender) == [5]
