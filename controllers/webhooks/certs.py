"""Webhook TLS: a self-generated CA and serving certificate, kept in a Secret so every
replica serves with the same key, and rotated before they expire.

The serving certificate is re-issued when less than a third of its lifetime is left (or
when the hosts it must cover change). The CA is replaced when less than a third of its
lifetime is left; the old CA stays in the published bundle until it expires, so the
apiserver trusts certificates from both while replicas switch over. The Secret is written
with the resourceVersion it was read at: two replicas rotating at once cannot overwrite
each other; the loser reads the winner's certificates.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes.client.exceptions import ApiException

from controllers.runtime.resources import SECRET, Kube, Obj
from controllers.runtime.selfsigned import ca_certificate

log = logging.getLogger(__name__)

CA_LIFETIME = dt.timedelta(days=365)
SERVING_LIFETIME = dt.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class CertBundle:
    """What the webhook server and its configurations need."""

    ca: KeyPair
    serving: KeyPair
    ca_bundle: bytes  # current CA plus older, unexpired ones

    @property
    def not_after(self) -> dt.datetime:
        return self.serving.cert.not_valid_after_utc


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def new_ca(
    common_name: str, lifetime: dt.timedelta = CA_LIFETIME, now: dt.datetime | None = None
) -> KeyPair:
    """A self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = now or _now()
    cert = ca_certificate(key, name, now - dt.timedelta(minutes=5), now + lifetime, path_length=0)
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving(
    ca: KeyPair,
    hosts: Sequence[str],
    lifetime: dt.timedelta = SERVING_LIFETIME,
    now: dt.datetime | None = None,
) -> KeyPair:
    """A serving certificate for `hosts` (DNS names or IP addresses), signed by `ca`."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = now or _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + lifetime, ca.cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def needs_renewal(cert: x509.Certificate, now: dt.datetime, fraction: float = 1 / 3) -> bool:
    """True once less than `fraction` of the certificate's lifetime remains."""
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now < lifetime * fraction


def covers(cert: x509.Certificate, hosts: Sequence[str]) -> bool:
    """Whether the certificate's SANs name every host."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return all(h in dns or h in ips for h in hosts)


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):
        return False
    return True


def _split_pem(bundle: bytes) -> list[x509.Certificate]:
    return list(x509.load_pem_x509_certificates(bundle)) if bundle.strip() else []


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(data: str | None) -> bytes:
    return base64.b64decode(data) if data else b""


class CertManager:
    """Keeps the webhook certificates in a Secret current and tells listeners on change.

    With `managed=False` the Secret belongs to someone else (cert-manager writes `tls.crt`,
    `tls.key` and `ca.crt` and renews them): it is only read, never written, and a
    renewal is picked up at the next check.
    """

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        secret_name: str,
        hosts: Sequence[str],
        *,
        ca_lifetime: dt.timedelta = CA_LIFETIME,
        serving_lifetime: dt.timedelta = SERVING_LIFETIME,
        check_interval: float = 600.0,
        clock: Callable[[], dt.datetime] = _now,
        managed: bool = True,
    ) -> None:
        self.managed = managed
        self.kube = kube
        self.namespace = namespace
        self.secret_name = secret_name
        self.hosts = list(hosts)
        self.ca_lifetime = ca_lifetime
        self.serving_lifetime = serving_lifetime
        self.check_interval = check_interval
        self._clock = clock
        self._listeners: list[Callable[[CertBundle], None]] = []
        self.current: CertBundle | None = None

    def on_change(self, listener: Callable[[CertBundle], None]) -> None:
        self._listeners.append(listener)

    def _from_secret(self, secret: Obj) -> CertBundle | None:
        data = secret.get("data") or {}
        try:
            ca = KeyPair(_unb64(data.get("ca.crt")), _unb64(data.get("ca.key")))
            serving = KeyPair(_unb64(data.get("tls.crt")), _unb64(data.get("tls.key")))
            bundle = _unb64(data.get("ca-bundle.crt")) or ca.cert_pem
            ca.cert  # noqa: B018 - parse to validate
            serving.cert  # noqa: B018
        except (ValueError, TypeError):
            return None
        return CertBundle(ca, serving, bundle)

    def _rotate(self, old: CertBundle | None) -> tuple[CertBundle, str]:
        """The bundle we want, given the one stored (which may be None or stale)."""
        now = self._clock()
        why = ""
        ca = old.ca if old else None
        bundle_certs = _split_pem(old.ca_bundle) if old else []
        if ca is None or needs_renewal(ca.cert, now):
            why = "new CA" if ca is None else "CA close to expiry"
            ca = new_ca("muster-webhook-ca", self.ca_lifetime, now)
        serving = old.serving if old else None
        if (
            serving is None
            or needs_renewal(serving.cert, now)
            or not covers(serving.cert, self.hosts)
            or not signed_by(serving.cert, ca.cert)
        ):
            why = why or "serving certificate close to expiry or hosts changed"
            serving = issue_serving(ca, self.hosts, self.serving_lifetime, now)
        # Publish the current CA first, then older CAs until they expire.
        kept = [c for c in bundle_certs if c.not_valid_after_utc > now and c != ca.cert]
        pem = ca.cert_pem + b"".join(c.public_bytes(serialization.Encoding.PEM) for c in kept)
        return CertBundle(ca, serving, pem), why

    def ensure(self) -> CertBundle:
        """Read the Secret, rotate what is due, write it back; returns the bundle in force."""
        if not self.managed:
            return self._external()
        for _ in range(5):
            secret = self.kube.get(SECRET, self.namespace, self.secret_name)
            stored = self._from_secret(secret) if secret else None
            wanted, why = self._rotate(stored)
            if stored is not None and not why and wanted.ca_bundle == stored.ca_bundle:
                self._publish(stored)
                return stored
            data = {
                "ca.crt": _b64(wanted.ca.cert_pem),
                "ca.key": _b64(wanted.ca.key_pem),
                "tls.crt": _b64(wanted.serving.cert_pem),
                "tls.key": _b64(wanted.serving.key_pem),
                "ca-bundle.crt": _b64(wanted.ca_bundle),
            }
            try:
                if secret is None:
                    body = {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "type": "Opaque",
                        "metadata": {"name": self.secret_name, "namespace": self.namespace},
                        "data": data,
                    }
                    self.kube.create(SECRET, self.namespace, body)
                else:
                    patch = {
                        "metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]},
                        "data": data,
                    }
                    self.kube.patch(SECRET, self.namespace, self.secret_name, patch)
            except ApiException as error:
                if error.status == 409:
                    continue  # another replica wrote first: use its certificates
                raise
            log.info("webhook certificates written", extra={"why": why or "hosts changed"})
            self._publish(wanted)
            return wanted
        raise RuntimeError("could not settle the webhook certificate Secret (kept conflicting)")

    def _external(self) -> CertBundle:
        """The certificates someone else keeps in the Secret, as they are."""
        where = f"Secret {self.namespace}/{self.secret_name}"
        secret = self.kube.get(SECRET, self.namespace, self.secret_name)
        if secret is None:
            raise RuntimeError(
                f"webhook certificates: {where} does not exist; with --webhook-certs external "
                "it is written by cert-manager (a Certificate with this secretName) or by you"
            )
        stored = self._from_secret(secret)
        if stored is None:
            raise RuntimeError(
                f"webhook certificates: {where} must hold PEM data in tls.crt, tls.key and "
                "ca.crt (the CA that signed tls.crt)"
            )
        if not covers(stored.serving.cert, self.hosts):
            log.warning(
                "webhook certificate does not name the webhook host",
                extra={"secret": where, "hosts": self.hosts},
            )
        self._publish(stored)
        return stored

    def _publish(self, bundle: CertBundle) -> None:
        if self.current == bundle:
            return
        self.current = bundle
        for listener in self._listeners:
            listener(bundle)

    def run(self, stop: threading.Event) -> None:
        """Check for due rotations (and other replicas' rotations) until `stop`."""
        while not stop.wait(self.check_interval):
            try:
                self.ensure()
            except Exception as error:
                log.warning("certificate check failed", extra={"error": str(error)[:300]})
