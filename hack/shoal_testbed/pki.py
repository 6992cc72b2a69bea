"""Certificates and keys for the testbed's control plane.

One CA signs the API server's serving certificate and a client certificate per
component, so the audit log names who did what. A separate RSA key pair signs
ServiceAccount tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class ClientIdentity:
    """A user as the API server sees it: CN is the user name, O the groups."""

    file_stem: str
    user: str
    groups: tuple[str, ...] = ()


# Built-in RBAC bindings exist for the two component users; the rest are admins.
CLIENTS = (
    ClientIdentity("admin", "kubernetes-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "system:kwok-controller", ("system:masters",)),
    ClientIdentity("podrunner", "system:testbed-podrunner", ("system:masters",)),
    # The real node (realnode.py): the Node authorizer's identity for its
    # kubelet, and kube-proxy's built-in binding (system:node-proxier).
    ClientIdentity("node", "system:node:real-node-0", ("system:nodes",)),
    ClientIdentity("kube-proxy", "system:kube-proxy"),
)
# The `kubernetes` Service's ClusterIP (the first of the service range): pods
# reach the API server there.
SERVICE_IP = "10.96.0.1"


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, groups: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def generate(pki_dir: Path, *, extra_ips: tuple[str, ...] = ()) -> None:
    """Write ca.{crt,key}, apiserver.{crt,key}, sa.{key,pub} and <client>.{crt,key}.
    extra_ips: more addresses the API server is reached at (the real node's)."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("shoal-testbed-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki_dir / "ca.key", ca_key)
    _write_cert(pki_dir / "ca.crt", ca_cert)

    def issue(
        stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(subject, ca_name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write_key(pki_dir / f"{stem}.key", key)
        _write_cert(pki_dir / f"{stem}.crt", builder.sign(ca_key, hashes.SHA256()))

    dns = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    issue(
        "apiserver",
        _name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName(d) for d in dns]
        + [
            x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", SERVICE_IP, *extra_ips)
        ],
    )
    for client in CLIENTS:
        issue(
            client.file_stem, _name(client.user, client.groups), ExtendedKeyUsageOID.CLIENT_AUTH, []
        )

    # ServiceAccount tokens: RSA, as every Kubernetes client library accepts it.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki_dir / "sa.key", sa_key)
    (pki_dir / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
