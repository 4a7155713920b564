"""A TLS front for a plain TCP server, for testing ``rediss://`` against a Redis built without TLS:
a self-signed certificate for 127.0.0.1 and a thread that accepts TLS connections and relays bytes."""

from __future__ import annotations

import datetime
import ipaddress
import selectors
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files for 127.0.0.1; the certificate is its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class TlsProxy:
    """Listens on 127.0.0.1:``port`` with TLS and relays each connection to 127.0.0.1:``target``."""

    def __init__(self, target: int, cert: Path, key: Path) -> None:
        self.target = target
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tls-proxy", daemon=True)
        self.handshakes = 0

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._relay, args=(raw,), daemon=True).start()

    def _relay(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(5)
            tls = self._ctx.wrap_socket(raw, server_side=True)
            self.handshakes += 1
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            raw.close()
            return
        tls.setblocking(False)
        upstream.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(tls, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, tls)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.2):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = src.recv(65536)
                    except (ssl.SSLWantReadError, BlockingIOError):
                        continue
                    if not data:
                        return
                    key.data.setblocking(True)
                    key.data.sendall(data)
                    key.data.setblocking(False)
                # bytes already decrypted inside the TLS object do not wake the selector
                while tls.pending():
                    upstream.setblocking(True)
                    upstream.sendall(tls.recv(65536))
                    upstream.setblocking(False)
        except OSError:
            return
        finally:
            sel.close()
            tls.close()
            upstream.close()
