"""The images a real node of the local cluster runs, built here without a Docker engine.

No registry is reachable, so every image is built from source with buildah (chroot isolation,
its own storage under the cache directory) and written as a docker-archive that containerd
imports. Each archive is named by a hash of exactly what goes into it, so an unchanged tree
is never rebuilt and a changed one always is:

- the base, the local `python:<version>-slim` the Dockerfiles start FROM: Debian's Python from
  mmdebstrap (`image_recipes/build_base.sh`), carrying the host's CA bundle and pip configuration so
  that pip inside a build trusts what the host trusts;
- the pause image, Kubernetes' own `build/pause/linux/pause.c` compiled static;
- Muster's image, from the repository's Dockerfile (the one `docker build` uses);
- the real workload of `examples/real-job/`.
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from controllers.localcluster.binaries import K8S_VERSION, cache_root

REPO = Path(__file__).resolve().parents[2]
RECIPES = Path(__file__).with_name("image_recipes")

# Debian bookworm's Python: the local base stands in for the official image of that version.
PYTHON = "3.11"
SUITE = "bookworm"
BASE_IMAGE = f"python:{PYTHON}-slim"
# build/pause/Makefile's TAG at K8S_VERSION; checked against the Makefile at build time.
PAUSE_VERSION = "3.10.2"
PAUSE_IMAGE = f"muster.local/pause:{PAUSE_VERSION}"
MUSTER_IMAGE_REPOSITORY = "muster/controller"
REAL_JOB_IMAGE = "muster/real-job:0.1.0"
REAL_JOB_SOURCE = REPO / "examples" / "real-job"
# Kubernetes' own flags for pause (build/pause/Makefile), the version string aside.
PAUSE_CFLAGS = ("-Os", "-Wall", "-Werror", "-static", "-s")
# Files the base carries from the host (build_base.sh copies them to the same paths).
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_PIP_CONF = Path("/etc/pip.conf")

Progress = Callable[[str], None]


class ImageError(RuntimeError):
    """An image could not be built; the message names the step and its log."""


@dataclass(frozen=True)
class ImageArchive:
    ref: str
    path: Path


def images_dir() -> Path:
    return cache_root() / "images"


def _quiet(_: str) -> None:
    pass


# --- what goes into an image, and its key ---------------------------------------------------


def _ignore_rules(source: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """The .dockerignore of `source` as (negated, pattern) rules, in order."""
    path = source / ".dockerignore"
    rules: list[tuple[bool, re.Pattern[str]]] = []
    if not path.is_file():
        return rules
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if negated else line).lstrip("/")
        rules.append((negated, re.compile(_pattern_regex(pattern))))
    return rules


def _pattern_regex(pattern: str) -> str:
    # Docker's syntax: `*` and `?` stay within one path element, `**` crosses them.
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def _excluded(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    # As Docker decides: a pattern matching a directory matches all under it; the last rule
    # that matches wins.
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negated, rule in rules:
        if any(rule.fullmatch(p) for p in prefixes):
            excluded = not negated
    return excluded


def _listed_files(source: Path) -> list[str] | None:
    """Tracked files and untracked ones git does not ignore (a new migration not added yet
    is part of the tree; build output and caches are not); None outside a git checkout."""
    try:
        result = subprocess.run(
            [
                "git",
                "-C",
                str(source),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        return None
    if result.returncode != 0:
        return None
    return [p for p in result.stdout.decode().split("\0") if p]


def _walked_files(source: Path, rules: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    negated = [rule.pattern for negate, rule in rules if negate]
    found: list[str] = []
    for root, dirs, files in os.walk(source):
        rel = Path(root).relative_to(source).as_posix()
        rel = "" if rel == "." else rel + "/"
        # Skip a directory the rules exclude and no exception reaches into (.venv, .git).
        dirs[:] = [
            d
            for d in dirs
            if not _excluded(rel + d, rules)
            or any(n.startswith(re.escape(rel + d)) for n in negated)
        ]
        found.extend(rel + f for f in files)
    return found


def context_files(source: Path) -> list[str]:
    """The files of `source` a build sends as its context, sorted: what git lists (else every
    file), less what `.dockerignore` excludes. The Dockerfile and .dockerignore always go."""
    rules = _ignore_rules(source)
    listed = _listed_files(source)
    if listed is None:
        listed = _walked_files(source, rules)
    keep = {p for p in listed if not _excluded(p, rules)} | {"Dockerfile", ".dockerignore"}
    return sorted(p for p in keep if (source / p).is_file())


def _digest(parts: list[tuple[str, bytes]]) -> str:
    """One hash over named parts: names and contents both count, in order."""
    total = hashlib.sha256()
    for name, data in parts:
        total.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return total.hexdigest()


def _file_part(root: Path, rel: str) -> tuple[str, bytes]:
    path = root / rel
    # The executable bit goes into the image, so it goes into the key.
    mode = "x" if os.access(path, os.X_OK) else "-"
    return f"{rel}:{mode}", path.read_bytes()


def context_key(source: Path, base_key: str, build_args: dict[str, str]) -> str:
    """The key of an image built from `source`: its context files, the build arguments and
    the identity of the base it starts FROM."""
    parts = [_file_part(source, rel) for rel in context_files(source)]
    parts.append(("build-args", json.dumps(build_args, sort_keys=True).encode()))
    parts.append(("base", base_key.encode()))
    return _digest(parts)


def _carried_files() -> list[Path]:
    """What the base copies from the host for pip: the CA bundle, /etc/pip.conf and the
    `cert` file it names."""
    carried = [p for p in (HOST_CA_BUNDLE, HOST_PIP_CONF) if p.is_file()]
    if HOST_PIP_CONF.is_file():
        config = configparser.ConfigParser()
        try:
            config.read(HOST_PIP_CONF)
        except configparser.Error as exc:
            raise ImageError(f"{HOST_PIP_CONF}: not a pip configuration file: {exc}") from exc
        cert = next((Path(s["cert"]) for s in config.values() if "cert" in s), None)
        if cert and cert.is_file() and cert not in carried:
            carried.append(cert)
    return carried


def _recipes(*names: str) -> list[tuple[str, bytes]]:
    """The build recipes beside this module, as key parts. They are not packaged in the
    wheel: images are built from a source checkout."""
    missing = [n for n in names if not (RECIPES / n).is_file()]
    if missing:
        raise ImageError(
            f"{RECIPES}: {', '.join(missing)} missing; images are built from a source checkout"
        )
    return [_file_part(RECIPES, n) for n in names]


def base_key() -> str:
    recipe = _recipes("build_base.sh", "base.Dockerfile")
    host = [(str(p), p.read_bytes()) for p in _carried_files()]
    return _digest([*recipe, *host, ("suite", SUITE.encode())])


# --- building --------------------------------------------------------------------------------


def _slug(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", ref)


def archive_path(ref: str, key: str) -> Path:
    return images_dir() / f"{_slug(ref)}-{key[:24]}.tar"


def _require(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise ImageError(f"{tool} is required to build images: apt-get install {package}")
    return found


class _Builder:
    """buildah with its own storage under the cache directory, every command logged."""

    def __init__(self, ref: str) -> None:
        self.buildah = _require("buildah", "buildah")
        state = images_dir() / "buildah"
        # vfs: plain directories, no kernel mount to leak when a build is interrupted and
        # none needed (works in an unprivileged container too); it costs disk while a build
        # runs, which cleanup() returns.
        self.global_args = [
            "--root",
            str(state / "root"),
            "--runroot",
            str(state / "run"),
            "--storage-driver",
            "vfs",
        ]
        self.log = images_dir() / "logs" / f"{_slug(ref)}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("")

    def run(self, step: str, argv: list[str], *, check: bool = True) -> None:
        with self.log.open("a") as out:
            out.write(f"$ {shlex.join(argv)}\n")
            out.flush()
            result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
        if check and result.returncode != 0:
            raise ImageError(f"{step} failed (exit {result.returncode}); see {self.log}")

    def buildah_run(self, step: str, *args: str, check: bool = True) -> None:
        self.run(step, [self.buildah, *self.global_args, *args], check=check)

    def build(self, context: Path, ref: str, build_args: dict[str, str], dockerfile: str) -> None:
        args = [f"--build-arg={k}={v}" for k, v in sorted(build_args.items())]
        self.buildah_run(
            f"buildah bud of {ref}",
            "bud",
            "--isolation=chroot",
            "--pull=never",
            "--layers=false",
            f"--file={context / dockerfile}",
            f"--tag={ref}",
            *args,
            str(context),
        )

    def load(self, archive: ImageArchive) -> None:
        # The base comes from its archive each time: the storage is scratch, the archive
        # is what the key names.
        self.buildah_run(f"loading {archive.ref}", "pull", f"docker-archive:{archive.path}")

    def push(self, ref: str, path: Path) -> None:
        self.buildah_run(f"writing {ref} to {path}", "push", ref, f"docker-archive:{path}:{ref}")

    def cleanup(self) -> None:
        # Containers and images of this build go; the archive is what stays. Best effort
        # (logged): a failure here must not hide the build's own error.
        self.buildah_run("removing working containers", "rm", "--all", check=False)
        self.buildah_run("removing images", "rmi", "--all", "--force", check=False)


@contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time per cache directory (make setup and a test may race)."""
    images_dir().mkdir(parents=True, exist_ok=True)
    with (images_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# Archives of one image kept, the most recently used first. Not one: several checkouts
# (worktrees, the upgrade test's copy) share the cache and build the same tag from different
# trees; keeping only the newest, each would delete the other's and rebuild its own.
KEEP_PER_IMAGE = 3


def _used(path: Path) -> None:
    """Mark a cache hit: the access time says when an archive was last wanted."""
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))


def _remove_stale(ref: str) -> None:
    pattern = re.compile(re.escape(_slug(ref)) + r"-[0-9a-f]{24}\.tar")
    same = [p for p in images_dir().glob("*.tar") if pattern.fullmatch(p.name)]
    same.sort(key=lambda p: p.stat().st_atime_ns, reverse=True)
    for old in same[KEEP_PER_IMAGE:]:
        old.unlink()


def _ensure(
    ref: str,
    key: str,
    fill: Callable[[Path, _Builder], None],
    *,
    dockerfile: str = "Dockerfile",
    build_args: dict[str, str] | None = None,
    base: ImageArchive | None = None,
    progress: Progress,
) -> ImageArchive:
    """The archive of `ref` at `key`; when missing, built from the context `fill` writes."""
    path = archive_path(ref, key)
    if path.is_file():
        _used(path)
        return ImageArchive(ref, path)
    builder = _Builder(ref)
    # Under the lock no build runs: a build- directory left is from one that was killed.
    for left in images_dir().glob("build-*"):
        shutil.rmtree(left, ignore_errors=True)
    progress(f"building {ref} (log: {builder.log})")
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix="build-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        fill(context, builder)
        part = Path(tmp) / "image.tar"
        try:
            if base:
                builder.load(base)
            builder.build(context, ref, build_args or {}, dockerfile)
            builder.push(ref, part)
        finally:
            builder.cleanup()
        part.replace(path)
    _used(path)
    _remove_stale(ref)
    progress(f"built {ref}: {path}")
    return ImageArchive(ref, path)


def _copy_context(source: Path) -> Callable[[Path, _Builder], None]:
    def fill(context: Path, _: _Builder) -> None:
        for rel in context_files(source):
            target = context / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, target)

    return fill


def ensure_base(progress: Progress = _quiet) -> ImageArchive:
    """The local `python:<version>-slim` every Dockerfile here starts FROM."""

    def fill(context: Path, builder: _Builder) -> None:
        _require("mmdebstrap", "mmdebstrap")
        shutil.copy(RECIPES / "base.Dockerfile", context / "base.Dockerfile")
        script = RECIPES / "build_base.sh"
        argv = ["bash", str(script), str(context / "rootfs.tar"), SUITE]
        builder.run(f"mmdebstrap of {SUITE}", argv + [str(p) for p in _carried_files()])

    with _locked():
        return _ensure(
            BASE_IMAGE, base_key(), fill, dockerfile="base.Dockerfile", progress=progress
        )


def _kubernetes_source() -> Path:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise ImageError("Go is required to fetch Kubernetes' pause source (see build_binaries.sh)")
    module = f"k8s.io/kubernetes@{K8S_VERSION}"
    result = subprocess.run(
        [go, "mod", "download", "-json", module], capture_output=True, text=True, check=False
    )
    try:
        return Path(json.loads(result.stdout)["Dir"])
    except (ValueError, KeyError) as exc:
        raise ImageError(
            f"`go mod download {module}` failed: {result.stderr.strip() or result.stdout.strip()}"
        ) from exc


def ensure_pause(progress: Progress = _quiet) -> ImageArchive:
    """Kubernetes' pause, static, from scratch: the image of every pod's sandbox."""
    pause_dir = _kubernetes_source() / "build" / "pause"
    tag = re.search(r"^TAG \?= (\S+)$", (pause_dir / "Makefile").read_text(), re.MULTILINE)
    if not tag or tag.group(1) != PAUSE_VERSION:
        found = tag.group(1) if tag else "no TAG"
        raise ImageError(
            f"{pause_dir / 'Makefile'}: pause is {found} at Kubernetes {K8S_VERSION}, "
            f"images.PAUSE_VERSION says {PAUSE_VERSION}: make them agree"
        )
    source = pause_dir / "linux" / "pause.c"
    define = f"-DVERSION=v{PAUSE_VERSION}-muster"
    key = _digest(
        [
            ("pause.c", source.read_bytes()),
            *_recipes("pause.Dockerfile"),
            ("cflags", " ".join([*PAUSE_CFLAGS, define]).encode()),
        ]
    )

    def fill(context: Path, builder: _Builder) -> None:
        gcc = _require("gcc", "gcc libc6-dev")
        shutil.copy(RECIPES / "pause.Dockerfile", context / "Dockerfile")
        argv = [gcc, *PAUSE_CFLAGS, define, "-o", str(context / "pause"), str(source)]
        builder.run("compiling pause.c", argv)

    with _locked():
        return _ensure(PAUSE_IMAGE, key, fill, progress=progress)


def chart_app_version(source: Path) -> str:
    chart = source / "charts" / "muster" / "Chart.yaml"
    try:
        return str(yaml.safe_load(chart.read_text())["appVersion"])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ImageError(f"{chart}: cannot read the chart's appVersion: {exc}") from exc


def _from_dockerfile(
    source: Path, ref: str, base: ImageArchive, base_id: str, progress: Progress
) -> ImageArchive:
    if not (source / "Dockerfile").is_file():
        raise ImageError(f"{source}: no Dockerfile to build {ref} from")
    args = {"PYTHON": PYTHON}
    key = context_key(source, base_id, args)
    return _ensure(ref, key, _copy_context(source), build_args=args, base=base, progress=progress)


def build_muster_image(source: Path, tag: str, progress: Progress = _quiet) -> ImageArchive:
    """Muster's image `muster/controller:<tag>` from the Dockerfile of the tree `source`."""
    base = ensure_base(progress)
    with _locked():
        ref = f"{MUSTER_IMAGE_REPOSITORY}:{tag}"
        return _from_dockerfile(source, ref, base, base_key(), progress)


def ensure_images(progress: Progress = _quiet) -> list[ImageArchive]:
    """The archives a real node imports: pause, Muster's image at the chart's appVersion, and
    the real workload; each built only when what goes into it changed."""
    base = ensure_base(progress)
    pause = ensure_pause(progress)
    muster = build_muster_image(REPO, chart_app_version(REPO), progress)
    with _locked():
        job = _from_dockerfile(REAL_JOB_SOURCE, REAL_JOB_IMAGE, base, base_key(), progress)
    return [pause, muster, job]
