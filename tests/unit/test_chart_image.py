"""What the container image installs: Muster's wheel carries the Alembic migrations, and
`muster db upgrade` works from that wheel installed into a fresh virtualenv, far from the
source tree. (The Dockerfile's own build needs a Docker engine, which CI does not have.)"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# What the Dockerfile copies into its build stage, and nothing else.
IMAGE_SOURCES = ("pyproject.toml", "README.md", "alembic.ini", "quota", "controllers", "migrations")


def test_the_wheel_carries_the_migrations_and_db_upgrade_works_from_it(tmp_path: Path) -> None:
    # Built from a copy of what the Dockerfile copies: the wheel cannot depend on anything
    # else, and setuptools' build/ directory stays out of the repository.
    source = tmp_path / "src"
    for name in IMAGE_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(REPO / name, source / name)
    dockerfile = (REPO / "Dockerfile").read_text()
    for name in IMAGE_SOURCES:
        assert name in dockerfile, f"the Dockerfile no longer copies {name}"
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    [wheel] = wheels.glob("muster-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"migrations/env.py", "migrations/script.py.mako"} <= names
    assert any(n.startswith("migrations/versions/0001_") for n in names)
    assert "controllers/localcluster/build_binaries.sh" in names

    # A fresh venv with the wheel alone; its dependencies come from the development venv's
    # site-packages (a path entry, so that venv's editable Muster is not picked up).
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(
        [str(python), "-c", "import controllers; print(controllers.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(site), where

    database = tmp_path / "history.db"
    upgrade = subprocess.run(
        [str(fresh / "bin" / "muster"), "db", "upgrade", "--database-url", f"sqlite:///{database}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    with sqlite3.connect(database) as conn:
        [(revision,)] = conn.execute("select version_num from alembic_version").fetchall()
    assert revision.startswith("0001")
