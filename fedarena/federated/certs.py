"""A throw-away certificate authority for loopback deployments and tests (mutual TLS between FL nodes).

:func:`loopback_pki` writes, into one folder, a self-signed CA (ECDSA P-256) and one node
certificate signed by it for ``localhost`` / ``127.0.0.1`` / ``::1`` with both the ``serverAuth``
and ``clientAuth`` extended key usages, so every node of a loopback deployment (scheduler,
FL-Servers, the observer) can present it as a server and as a client. Given ``client_ids`` it also
issues one client certificate per client (``clients/<id>.pem`` / ``.key``, common name and DNS
subject alternative name = the client id, ``clientAuth`` only); nodes then check on every stream that
a client's certificate names the client id of its token (``TLSFiles.client_certs``). It returns the
:class:`~fedarena.federated.transport.TLSFiles` with ``mutual=True``. Keys are ECDSA P-256; private
keys are written with mode 0600; the CA's key is not kept (nothing else can be signed later). A real
deployment gives each node its own key pair signed by its CA, with the same ``TLSFiles`` layout.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import Sequence

from fedarena.federated.transport import TLSFiles


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def loopback_pki(folder: str | Path, *, days: int = 30, common_name: str = "fedarena loopback CA",
                 client_ids: Sequence[str] = ()) -> TLSFiles:
    """Create ``ca.pem``, ``node.pem`` and ``node.key`` in ``folder`` (plus ``clients/<id>.pem`` / ``.key`` for each
    of ``client_ids``); returns mutual-TLS ``TLSFiles`` for them.

    Files already there are reused (a resumed deployment keeps its certificates)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ca_path, cert_path, key_path = folder / "ca.pem", folder / "node.pem", folder / "node.key"
    clients = folder / "clients"
    files = TLSFiles(cert_chain=str(cert_path), private_key=str(key_path), root_cert=str(ca_path),
                     server_name="localhost", mutual=True, client_certs=str(clients) if client_ids else "")
    have = all((clients / f"{c}.pem").exists() and (clients / f"{c}.key").exists() for c in client_ids)
    if ca_path.exists() and cert_path.exists() and key_path.exists() and have:
        return files
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    node_key = ec.generate_private_key(ec.SECP256R1())
    node = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(node_key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    if client_ids:
        clients.mkdir(exist_ok=True)
    for cid in client_ids:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cid)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(cid)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        (clients / f"{cid}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(clients / f"{cid}.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(node.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, node_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    return files
