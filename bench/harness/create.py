"""Objects into the cluster: created as a user creates them (`kubectl create`, several
processes at once, so that the apiserver, not one client, sets the pace) or applied."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from controllers.localcluster.kubectl import kubectl

Doc = Mapping[str, Any]


def create_all(
    kc: str, kubeconfig: str | Path, docs: Sequence[Doc], processes: int = 4, timeout: float = 3600
) -> None:
    """`kubectl create -f -` of `docs` in `processes` kubectl processes at once. A stream is
    cut only before an object that is not a Pod, so that a gang's PodGroup and its pods go
    through one stream, the group first. The first failure is raised once all are done."""
    chunk = max(1, -(-len(docs) // processes))
    cuts = [0]
    for i in range(chunk, len(docs), chunk):
        while i < len(docs) and docs[i]["kind"] == "Pod":
            i += 1
        if i < len(docs) and i > cuts[-1]:
            cuts.append(i)
    cuts.append(len(docs))
    errors: list[BaseException] = []

    def create(part: Sequence[Doc]) -> None:
        try:
            kubectl(
                kc,
                kubeconfig,
                "create",
                "-f",
                "-",
                input=yaml.safe_dump_all(list(part)),
                timeout=timeout,
            )
        except Exception as error:  # raised again below, in the caller's thread
            errors.append(error)

    threads = [
        threading.Thread(target=create, args=(docs[a:b],))
        for a, b in itertools.pairwise(cuts)
        if b > a
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def apply(
    kc: str,
    kubeconfig: str | Path,
    docs: Sequence[Doc],
    server_side: bool = False,
    timeout: float = 600,
) -> None:
    """`kubectl apply -f -` of `docs` (server-side, taking over conflicting fields, if asked)."""
    flags = ("--server-side", "--force-conflicts") if server_side else ()
    body = yaml.safe_dump_all(list(docs))
    kubectl(kc, kubeconfig, "apply", *flags, "-f", "-", input=body, timeout=timeout)
