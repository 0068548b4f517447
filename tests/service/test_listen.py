"""What the service listens on: HTTPS served by the listener itself, with a certificate it
was given (callers that trust it are served, plain HTTP is not, and a certificate that
cannot serve is refused with the file before anything starts); and an admin listener that
takes /metrics and /ready off the public one."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support import Services, coordinator, free_port


def certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_the_listener_serves_https_to_callers_that_trust_its_certificate(
    services: Services, tmp_path: Path
) -> None:
    cert, key = certificate(tmp_path, "listener")
    port = free_port()
    listen = {"host": "127.0.0.1", "port": port, "tls": {"certificate": str(cert), "key": str(key)}}
    service = services(["chain"], extra={"listen": listen})
    trusted = ssl.create_default_context(cafile=str(cert))
    answer = httpx.get(f"https://127.0.0.1:{port}/health", verify=trusted, timeout=30)
    assert answer.status_code == 200
    assert f"https://127.0.0.1:{port}" in service.log.read_text()  # where it says it listens
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
    with pytest.raises(httpx.ConnectError):  # a caller that does not trust it is refused
        httpx.get(f"https://127.0.0.1:{port}/health", timeout=30)


def test_a_key_of_another_certificate_is_refused_with_the_file(
    services: Services, tmp_path: Path
) -> None:
    cert, _ = certificate(tmp_path, "one")
    _, other = certificate(tmp_path, "two")
    listen = {
        "host": "127.0.0.1",
        "port": free_port(),
        "tls": {"certificate": str(cert), "key": str(other)},
    }
    config = services.configure(["chain"], extra={"listen": listen})
    refused = coordinator("serve", "--config", config)
    assert refused.returncode == 1
    assert "listen.tls:" in refused.stderr and "cannot serve TLS" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_admin_listener_takes_metrics_and_ready_off_the_public_one(
    services: Services,
) -> None:
    public, admin = free_port(), free_port()
    listen = {"host": "127.0.0.1", "port": public, "admin": {"port": admin}}
    services(["chain"], extra={"listen": listen})
    for path in ("/metrics", "/ready"):
        hidden = httpx.get(f"http://127.0.0.1:{public}{path}", timeout=30)
        assert (hidden.status_code, hidden.json()["code"]) == (404, "route.not-found"), path
    assert httpx.get(f"http://127.0.0.1:{public}/health", timeout=30).status_code == 200
    scraped = httpx.get(f"http://127.0.0.1:{admin}/metrics", timeout=30)
    assert scraped.status_code == 200 and "coordinator_runs_started" in scraped.text
    assert httpx.get(f"http://127.0.0.1:{admin}/ready", timeout=30).json()["ready"] is True
    assert httpx.get(f"http://127.0.0.1:{admin}/v1/runs", timeout=30).status_code == 404
