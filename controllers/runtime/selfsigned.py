"""A self-signed certificate authority's certificate: the local cluster's CA and the webhooks'
CA are both this shape (a CA that signs certificates and revocation lists, nothing else)."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec


def ca_certificate(
    key: ec.EllipticCurvePrivateKey,
    name: x509.Name,
    not_before: dt.datetime,
    not_after: dt.datetime,
    *,
    path_length: int | None,
) -> x509.Certificate:
    """A CA certificate for `key`, issued by itself. `path_length` 0 lets it sign only leaf
    certificates; None sets no limit."""
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
