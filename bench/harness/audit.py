"""The apiserver's audit log of writes: which client wrote what. A local cluster whose
apiserver keeps one, client identities of their own (so that the log tells a controller's
writes from everyone else's), and the log read between two marks."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controllers.localcluster import pki
from controllers.localcluster.cluster import LocalCluster

POLICY = Path(__file__).resolve().parents[1] / "kueue" / "audit-policy.yaml"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def audit_writes(lines: Iterable[str], user: str) -> Counter[str]:
    """Writes `user` made, by "verb resource[/subresource]", from audit log lines (JSON,
    one event per line; only the ResponseComplete stage counts, so each request once)."""
    counts: Counter[str] = Counter()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
            continue
        if (event.get("user") or {}).get("username") != user:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or "?"
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        counts[f"{event['verb']} {resource}"] += 1
    return counts


class AuditedCluster(LocalCluster):
    """The local cluster, its apiserver writing an audit log of every write."""

    @property
    def audit_log(self) -> Path:
        return self.directory / "logs" / "audit.log"

    def _start(self, name: str, argv: list[str], *rest: Any, **kwargs: Any) -> None:
        if name == "kube-apiserver":
            argv = [
                *argv,
                "--audit-policy-file",
                str(POLICY),
                "--audit-log-path",
                str(self.audit_log),
                "--audit-log-maxsize",
                "0",
            ]
        super()._start(name, argv, *rest, **kwargs)


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def writes(self, since: int, user: str) -> Counter[str]:
        # The apiserver writes each event in one write(); a line cut at the end of the file
        # is the next event, and is read whole by the next call.
        with open(self.path, "rb") as f:
            f.seek(since)
            data = f.read()
        return audit_writes(data.decode(errors="replace").splitlines(), user)

    def wait_quiet(self, user: str, quiet: float, timeout: float = 300) -> None:
        """Until `user` has written nothing but Lease renewals for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        mark, since = self.mark(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.5)
            writes = self.writes(mark, user)
            if any(not k.endswith(" leases") for k in writes):
                mark, since = self.mark(), time.monotonic()
            elif time.monotonic() - since >= quiet:
                return


def client_kubeconfig(cluster: LocalCluster, user: str) -> Path:
    """A kubeconfig for `user` (group system:masters), signed by the cluster's CA, so that
    the audit log names this client's writes."""
    pki_dir = cluster.directory / "pki"
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, user),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pair = pki.KeyPair(pki_dir / f"{user}.crt", pki_dir / f"{user}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    return pki.write_kubeconfig(
        cluster.directory / f"{user}.kubeconfig", server, pki_dir / "ca.crt", pair, user
    )
