"""What decides whether an image is rebuilt: the key of what goes into it. A change to a file
the Dockerfile copies, to the base it starts from, or to what the base carries from the host
rebuilds; a file the build never sees does not. And the real workload's manifests agree with
each other and with the image the node is given."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from controllers.localcluster import images
from controllers.main import main
from quota.api import ClusterQueue, LocalQueue, ResourceFlavor, parse_manifest
from quota.api.names import QUEUE_LABEL

REPO = Path(__file__).resolve().parents[2]
ARGS = {"PYTHON": "3.11"}


def _tree(root: Path) -> Path:
    """A small source tree with the repository's Dockerfile and .dockerignore."""
    root.mkdir()
    for name in ("Dockerfile", ".dockerignore"):
        shutil.copy(REPO / name, root / name)
    for rel, text in {
        "pyproject.toml": "[project]\nname = 'x'\n",
        "README.md": "x\n",
        "alembic.ini": "[alembic]\n",
        "quota/__init__.py": "",
        "quota/core.py": "ANSWER = 1\n",
        "controllers/__init__.py": "",
        "migrations/env.py": "",
        "docs/notes.md": "not copied by the Dockerfile\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = _tree(tmp_path / "src")
    (root / ".gitignore").write_text("__pycache__/\n*.egg-info/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "tree")
    return root


def test_a_changed_copied_file_changes_the_key(checkout: Path) -> None:
    before = images.context_key(checkout, "base", ARGS)
    assert images.context_key(checkout, "base", ARGS) == before
    (checkout / "quota" / "core.py").write_text("ANSWER = 2\n")
    assert images.context_key(checkout, "base", ARGS) != before


def test_files_the_build_never_sees_do_not_change_the_key(checkout: Path) -> None:
    before = images.context_key(checkout, "base", ARGS)
    # Ignored by git: bytecode and build metadata beside the sources.
    (checkout / "quota" / "__pycache__").mkdir()
    (checkout / "quota" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (checkout / "muster.egg-info").mkdir()
    (checkout / "muster.egg-info" / "PKG-INFO").write_text("x\n")
    # Excluded by .dockerignore: docs are not part of the image.
    (checkout / "docs" / "notes.md").write_text("changed\n")
    (checkout / "scratch.txt").write_text("untracked, outside what the Dockerfile copies\n")
    assert images.context_key(checkout, "base", ARGS) == before


def test_a_new_file_not_added_to_git_yet_is_part_of_the_image(checkout: Path) -> None:
    # A new Alembic revision the developer has not `git add`ed: docker build would copy it,
    # so the image built here has it too.
    before = images.context_key(checkout, "base", ARGS)
    (checkout / "migrations" / "versions").mkdir()
    (checkout / "migrations" / "versions" / "0099_new.py").write_text("revision = '0099'\n")
    assert "migrations/versions/0099_new.py" in images.context_files(checkout)
    assert images.context_key(checkout, "base", ARGS) != before


def test_the_base_and_the_build_arguments_enter_the_key(checkout: Path) -> None:
    key = images.context_key(checkout, "base-a", ARGS)
    assert images.context_key(checkout, "base-b", ARGS) != key
    assert images.context_key(checkout, "base-a", {"PYTHON": "3.12"}) != key


def test_outside_git_the_dockerignore_decides(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    (root / "quota" / "__pycache__").mkdir()
    (root / "quota" / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "big.so").write_bytes(b"\0")
    assert images.context_files(root) == [
        ".dockerignore",
        "Dockerfile",
        "README.md",
        "alembic.ini",
        "controllers/__init__.py",
        "migrations/env.py",
        "pyproject.toml",
        "quota/__init__.py",
        "quota/core.py",
    ]


def test_the_repositorys_context_is_what_its_dockerfile_copies() -> None:
    copied = ("pyproject.toml", "README.md", "alembic.ini", "quota/", "controllers/", "migrations/")
    dockerfile = (REPO / "Dockerfile").read_text()
    for name in copied:
        assert f"COPY {name}" in dockerfile or f" {name} " in dockerfile, name
    files = images.context_files(REPO)
    assert {"Dockerfile", ".dockerignore", "pyproject.toml", "quota/__init__.py"} <= set(files)
    assert "controllers/localcluster/images.py" in files
    outside = [
        f
        for f in files
        if f not in {"Dockerfile", ".dockerignore", *copied} and not f.startswith(copied)
    ]
    assert outside == []
    assert not any("__pycache__" in f for f in files)


def test_what_the_base_carries_from_the_host_enters_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ca.crt"
    bundle.write_text("one authority\n")
    conf = tmp_path / "pip.conf"
    monkeypatch.setattr(images, "HOST_CA_BUNDLE", bundle)
    monkeypatch.setattr(images, "HOST_PIP_CONF", conf)
    without_conf = images.base_key()
    extra = tmp_path / "extra.pem"
    extra.write_text("another authority\n")
    conf.write_text(f"[global]\ncert = {extra}\n")
    # pip.conf and the cert file it names are carried, and count.
    assert images._carried_files() == [bundle, conf, extra]
    with_conf = images.base_key()
    assert with_conf != without_conf
    bundle.write_text("a different authority\n")
    assert images.base_key() != with_conf


def test_a_missing_tool_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUSTER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(images.ImageError, match=r"buildah is required .*apt-get install buildah"):
        images.ensure_base()
    # The command says the same, as an error, not a traceback.
    result = CliRunner().invoke(main, ["local-cluster", "images"])
    assert result.exit_code == 1
    assert "Error: buildah is required to build images: apt-get install buildah" in result.output


def test_a_new_archive_removes_the_least_recently_used_of_the_same_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MUSTER_CACHE_DIR", str(tmp_path))
    images.images_dir().mkdir(parents=True)
    ref = "muster/controller:0.1.0"
    archives = [images.archive_path(ref, digit * 64) for digit in "abcd"]
    other_tag = images.archive_path("muster/controller:0.1.0-rc1", "e" * 64)
    for used, path in enumerate([other_tag, *archives]):
        path.write_bytes(b"")
        os.utime(path, (used, used))
    # Archive a, though built first, was wanted last: b is the least recently used.
    os.utime(archives[0], (100, 0))
    images._remove_stale(ref)
    kept = {p.name for p in images.images_dir().glob("*.tar")}
    assert kept == {p.name for p in (archives[0], archives[2], archives[3], other_tag)}
    assert images.KEEP_PER_IMAGE == 3


def test_the_real_job_runs_in_its_queue_on_the_real_node_only() -> None:
    example = REPO / "examples" / "real-job"
    docs = list(yaml.safe_load_all((example / "queues.yaml").read_text()))
    objects = [parse_manifest(d, i) for i, d in enumerate(docs) if d["apiVersion"] != "v1"]
    [flavor] = [o for o in objects if isinstance(o, ResourceFlavor)]
    [cluster_queue] = [o for o in objects if isinstance(o, ClusterQueue)]
    [local_queue] = [o for o in objects if isinstance(o, LocalQueue)]
    job = yaml.safe_load((example / "job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]

    assert job["metadata"]["labels"][QUEUE_LABEL] == local_queue.metadata.name
    assert job["metadata"]["namespace"] == local_queue.metadata.namespace
    assert local_queue.spec.cluster_queue == cluster_queue.metadata.name
    assert [f.name for f in cluster_queue.spec.flavors] == [flavor.metadata.name]
    # The real node's label, which kwok's fake nodes never carry.
    assert pod["nodeSelector"] == flavor.spec.node_labels == {"muster.dev/real-node": "true"}
    [container] = pod["containers"]
    assert container["image"] == images.REAL_JOB_IMAGE
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert job["spec"]["parallelism"] == 2
