"""The images a real node imports, built for real without a Docker engine: Muster's runs
`muster` as 65532, the real workload computes its answer, pause is a static binary, and a
second call finds everything cached and builds nothing. (Slow the first time: the base is a
Debian root filesystem; later runs reuse the archives in the cache directory.)"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from controllers.localcluster import images

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def archives() -> dict[str, images.ImageArchive]:
    built = images.ensure_images()
    return {a.ref.rsplit(":", 1)[0]: a for a in built}


@pytest.fixture
def buildah(tmp_path: Path) -> Iterator[list[str]]:
    """buildah with a storage of its own, so running images here never touches the builder's."""
    argv = [
        "buildah",
        "--root",
        str(tmp_path / "root"),
        "--runroot",
        str(tmp_path / "run"),
        "--storage-driver",
        "vfs",
    ]
    yield argv
    subprocess.run([*argv, "rm", "--all"], capture_output=True, check=False)
    shutil.rmtree(tmp_path / "root", ignore_errors=True)


def _config(archive: images.ImageArchive) -> dict[str, object]:
    result = subprocess.run(
        ["skopeo", "inspect", "--config", f"docker-archive:{archive.path}"],
        capture_output=True,
        text=True,
        check=True,
    )
    config: dict[str, object] = json.loads(result.stdout)["config"]
    return config


class _Container:
    """A working container of an image archive, to run commands in (chroot, no engine)."""

    def __init__(self, buildah: list[str], archive: images.ImageArchive) -> None:
        self.buildah = buildah
        self.name = subprocess.run(
            [*buildah, "from", "--pull-never", "--quiet", f"docker-archive:{archive.path}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def run(self, *argv: str, env: str = "") -> str:
        extra = ["--env", env] if env else []
        result = subprocess.run(
            [*self.buildah, "run", "--isolation", "chroot", *extra, self.name, "--", *argv],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout


def test_muster_runs_as_65532_with_muster_as_its_entrypoint(
    archives: dict[str, images.ImageArchive], buildah: list[str]
) -> None:
    muster = archives[images.MUSTER_IMAGE_REPOSITORY]
    assert muster.ref == f"{images.MUSTER_IMAGE_REPOSITORY}:{images.chart_app_version(images.REPO)}"
    config = _config(muster)
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["muster"]
    assert config["Cmd"] == ["controller"]
    container = _Container(buildah, muster)
    assert "Usage: muster" in container.run("muster", "--help")
    assert container.run("id", "-u").strip() == "65532"
    # The migrations travel in the image: the history store is created from them there.
    container.run("muster", "db", "upgrade", "--database-url", "sqlite:////tmp/history.db")
    db = "sqlite3.connect('/tmp/history.db')"
    read = f"import sqlite3; print({db}.execute('select * from alembic_version').fetchone()[0])"
    head = ScriptDirectory(str(images.REPO / "migrations")).get_current_head()
    assert container.run("/opt/muster/bin/python", "-c", read).strip() == head
    # Only what runs: no pip in Muster's virtualenv, no wheels left behind.
    probe = "import importlib.util as u, os; print(u.find_spec('pip'), os.path.exists('/wheels'))"
    assert container.run("/opt/muster/bin/python", "-c", probe).split() == [
        "None",
        "False",
    ]


def test_the_real_workload_computes_its_answer(
    archives: dict[str, images.ImageArchive], buildah: list[str]
) -> None:
    job = archives[images.REAL_JOB_IMAGE.rsplit(":", 1)[0]]
    assert _config(job)["User"] == "65532:65532"
    out = _Container(buildah, job).run("python3", "/job.py", env="COLLATZ_BELOW=1000000")
    assert "longest_start=837799 steps=524" in out


def _layer_file(archive: Path, name: str, target: Path) -> None:
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer)) as inner:
                for member in inner:
                    if member.name.lstrip("./") == name:
                        target.write_bytes(inner.extractfile(member).read())  # type: ignore[union-attr]
                        target.chmod(0o755)
                        return
    raise AssertionError(f"{archive} holds no {name}")


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF asks for a dynamic loader (a PT_INTERP header)."""
    assert elf[:5] == b"\x7fELF\x02"
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def test_pause_is_kubernetes_pause_static_and_alone(
    archives: dict[str, images.ImageArchive], tmp_path: Path
) -> None:
    pause = archives[images.PAUSE_IMAGE.rsplit(":", 1)[0]]
    assert pause.ref == images.PAUSE_IMAGE
    config = _config(pause)
    assert config["Entrypoint"] == ["/pause"]
    assert config["User"] == "65535:65535"
    binary = tmp_path / "pause"
    _layer_file(pause.path, "pause", binary)
    assert not _has_interpreter(binary.read_bytes())
    version = subprocess.run([str(binary), "-v"], capture_output=True, text=True, check=True)
    assert f"v{images.PAUSE_VERSION}" in version.stdout
    assert pause.path.stat().st_size < 2_000_000


def test_a_second_call_builds_nothing(archives: dict[str, images.ImageArchive]) -> None:
    # Built again would mean a new file (a new inode) and a new modification time.
    before = {a.path: (a.path.stat().st_ino, a.path.stat().st_mtime_ns) for a in archives.values()}
    started = time.monotonic()
    again = images.ensure_images()
    elapsed = time.monotonic() - started
    assert {a.path: (a.path.stat().st_ino, a.path.stat().st_mtime_ns) for a in again} == before
    assert elapsed < 1.0, f"a cached call took {elapsed:.2f} s"


def test_a_failed_build_names_its_step_and_log_and_leaves_no_archive(
    archives: dict[str, images.ImageArchive], tmp_path: Path
) -> None:
    source = tmp_path / "broken"
    source.mkdir()
    (source / "Dockerfile").write_text(
        "ARG PYTHON=3.12\nFROM python:${PYTHON}-slim\nRUN echo 'step that fails' && false\n"
    )
    with pytest.raises(images.ImageError) as failed:
        images.build_muster_image(source, "broken")
    message = str(failed.value)
    assert message.startswith(f"buildah bud of {images.MUSTER_IMAGE_REPOSITORY}:broken failed")
    log = Path(message.rsplit("see ", 1)[1])
    assert "step that fails" in log.read_text()
    assert not list(images.images_dir().glob("muster_controller_broken-*.tar"))
