"""What a real node changes on this machine, recorded before it starts and undone after.

A kubelet, kube-proxy, containerd and the CNI bridge plugin change the host itself: kernel
settings (the kubelet sets `kernel.panic_on_oops` to 1, so an oops would reboot the machine),
iptables chains, the `cni0` bridge, mounts (pod volumes, container root filesystems, network
namespaces) and cgroups. `record` keeps the kernel settings' values before the node starts;
`undo` puts them back and removes every other trace by its name or place, so a machine that
ran `muster local-cluster up --real-node` and `down` is as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

# Every kernel setting a node component may change (kubelet: kubelet/cm/container_manager's
# kernel tunables; the bridge plugin: ip_forward; kube-proxy is told to leave its own alone).
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
)
# iptables chains the node's components own: kube-proxy's and the kubelet's KUBE-*, the CNI
# plugins' CNI-*.
CHAIN_PREFIXES = ("KUBE-", "CNI-")
# cgroups the kubelet (cgroupfs driver) and containerd create under each hierarchy.
CGROUPS = ("kubepods", "k8s.io")
BRIDGE = "cni0"
NETNS_DIR = Path("/run/netns")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def record(path: Path) -> dict[str, str]:
    """Write the current value of each kernel setting the node may change to `path`."""
    values: dict[str, str] = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    path.write_text(json.dumps(values, indent=2))
    return values


def restore_sysctls(path: Path) -> list[str]:
    """Put back the values `record` kept; return the settings that had changed."""
    if not path.is_file():
        return []
    changed: list[str] = []
    for name, value in json.loads(path.read_text()).items():
        target = _sysctl_path(name)
        with contextlib.suppress(OSError):
            if target.read_text().strip() != value:
                target.write_text(value)
                changed.append(name)
    return changed


def _ours(line: str) -> bool:
    """Whether one line of iptables-save declares, fills or jumps to a chain of ours."""
    words = line.split()
    if line.startswith(":"):
        return line[1:].startswith(CHAIN_PREFIXES)
    if line.startswith("-A "):
        targets = [words[1]] + [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-j", "-g")]
        return any(t.startswith(CHAIN_PREFIXES) for t in targets)
    return False


def without_ours(lines: list[str]) -> list[str]:
    """An iptables-save dump without the node's chains and the rules that fill or reach them."""
    return [line for line in lines if not _ours(line)]


def remove_chains() -> int:
    """Remove every KUBE-* and CNI-* chain and every rule that jumps to one, in each table of
    iptables and ip6tables, leaving every other rule as it is; return how many lines went."""
    removed = 0
    for family in ("iptables", "ip6tables"):
        save, restore = f"{family}-save", f"{family}-restore"
        if shutil.which(save) is None or shutil.which(restore) is None:
            continue
        dump = subprocess.run([save], capture_output=True, text=True, check=False)
        if dump.returncode != 0:
            continue
        lines = dump.stdout.splitlines()
        kept = without_ours(lines)
        if len(kept) == len(lines):
            continue
        subprocess.run([restore], input="\n".join(kept) + "\n", text=True, check=True)
        removed += len(lines) - len(kept)
    return removed


def _mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        # The fifth field is the mount point, with spaces and the like octal-escaped.
        points.append(line.split()[4].encode().decode("unicode_escape"))
    return points


def unmount_under(roots: list[Path]) -> int:
    """Lazily unmount every mount below each root (pod volumes, container root filesystems,
    network namespaces), the deepest first; return how many there were."""
    prefixes = [str(r.resolve()).rstrip("/") + "/" for r in roots if r.exists()]
    inside = [p for p in _mountpoints() if any(p.startswith(prefix) for prefix in prefixes)]
    for point in sorted(set(inside), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    return len(set(inside))


def remove_netns() -> None:
    """Network namespaces the CNI plugins left (their sandbox was never torn down)."""
    if not NETNS_DIR.is_dir():
        return
    for entry in NETNS_DIR.glob("cni-*"):
        subprocess.run(["umount", "-l", str(entry)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            entry.unlink()


def remove_bridge() -> bool:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        return False
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    return True


def remove_cgroups(root: Path = Path("/sys/fs/cgroup")) -> int:
    """Remove the kubelet's and containerd's cgroups in every hierarchy, the leaves first
    (a cgroup directory is removed with rmdir once it holds no process)."""
    removed = 0
    hierarchies = [root, *[p for p in root.iterdir() if p.is_dir()]] if root.is_dir() else []
    for hierarchy in hierarchies:
        for name in CGROUPS:
            top = hierarchy / name
            if not top.is_dir():
                continue
            for directory, _subdirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
                    removed += 1
    return removed
