"""The database over TLS with ``sslmode=verify-full``: the service reaches a PostgreSQL
only over TLS, with a certificate for 127.0.0.1 a self-signed CA issued, trusting that CA
alone; a CA that did not issue it is refused in one line (exit 1)."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import shutil
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from registry_coordinator.store.embedded import EmbeddedPostgres
from tests.support import Services, coordinator, wait_state, write_config

KEY_PEM = (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def issuing_ca(
    directory: Path, name: str
) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def server_certificate(
    directory: Path, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = directory / "server.crt", directory / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(*KEY_PEM, serialization.NoEncryption()))
    return cert_file, key_file


class TlsFront:
    """A loopback TLS front for a PostgreSQL that cannot serve TLS itself (the wheel's is
    built without it): it speaks PostgreSQL 17's direct TLS negotiation (ALPN
    ``postgresql``, ``sslnegotiation=direct``), presents a certificate for 127.0.0.1 that
    the test's CA issued, and passes each session on to the server's Unix socket. What is
    tested is the client's side: that a DSN with ``sslmode=verify-full`` and a CA is
    honoured, and that a CA that did not issue the certificate is refused."""

    def __init__(self, socket_path: str, cert: Path, key: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.context.set_alpn_protocols(["postgresql"])
        self.socket_path = socket_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()  # a client that did not trust the certificate
            return
        self.handshakes += 1
        with tls, socket.socket(socket.AF_UNIX) as server:
            server.connect(self.socket_path)
            back = threading.Thread(target=_pipe, args=(server, tls), daemon=True)
            back.start()
            _pipe(tls, server)
            back.join(30)

    def close(self) -> None:
        self.listener.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def tls_postgres() -> Iterator[tuple[str, Path, Path, TlsFront]]:
    """A PostgreSQL of its own behind a TLS front: the DSN that reaches it over TLS (no
    sslmode yet), the CA that issued the front's certificate, another CA that issued
    nothing it serves, and the front."""
    directory = Path(tempfile.mkdtemp(prefix="coordinator-tls-"))
    directory.chmod(0o755)
    server = EmbeddedPostgres(directory / "pgdata")
    unix = server.start()
    ca, ca_key, ca_cert = issuing_ca(directory, "test-ca")
    stranger, _, _ = issuing_ca(directory, "other-ca")
    cert, key = server_certificate(directory, ca_key, ca_cert)
    host = unix.split("host=", 1)[1].split("&", 1)[0]
    front = TlsFront(f"{host}/.s.PGSQL.5432", cert, key)
    user = unix.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
    try:
        yield f"postgresql://{user}@127.0.0.1:{front.port}/coordinator", ca, stranger, front
    finally:
        front.close()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_service_runs_over_verify_full_tls_and_a_stranger_ca_is_refused(
    tls_postgres: tuple[str, Path, Path, TlsFront], tmp_path: Path
) -> None:
    tcp, ca, stranger, front = tls_postgres
    verified = f"{tcp}?sslmode=verify-full&sslnegotiation=direct&sslrootcert={ca}"
    config = write_config(tmp_path, verified, ["chain"])
    migrated = coordinator("migrate", "--config", config)
    assert migrated.returncode == 0, migrated.stderr
    with Services(tmp_path, verified) as services:
        service = services.start(config)
        run = service.start_run("chain", {"n": 1})
        wait_state(verified, run, RunState.FINISHED)
        with sync_connection(verified) as conn:
            sessions = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE application_name LIKE 'coordinator/%%'"
            ).fetchone()
        assert sessions is not None and sessions["n"] > 0  # every session came over TLS:
        assert front.handshakes >= sessions["n"] + 1  # there is no other way in
        assert service.stop() == 0

    strange = f"{tcp}?sslmode=verify-full&sslnegotiation=direct&sslrootcert={stranger}"
    refused = write_config(tmp_path, strange, ["chain"])
    looked = coordinator("serve", "--config", refused)
    assert looked.returncode == 1, looked.stderr
    assert "database refused the connection" in looked.stderr
    assert "certificate verify failed" in looked.stderr and "Traceback" not in looked.stderr
