"""A minimal Docker-style token service for the test registry's `auth: token` mode.

The registry (CNCF distribution, real) verifies our ES256 JWTs against the certificate it was
configured with; this service only checks a basic-auth login and grants what was asked.
"""

from __future__ import annotations

import base64
import datetime
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_signing_material(directory: Path) -> tuple[Path, Path]:
    """A P-256 key and a self-signed certificate (the registry's rootcertbundle); kept across runs."""
    key_path, cert_path = directory / "token-key.pem", directory / "token-cert.pem"
    if key_path.exists() and cert_path.exists():
        return key_path, cert_path
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bakery test token issuer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


class TokenServer:
    def __init__(self, key_path: Path, cert_path: Path, service: str, issuer: str, users: dict, port: int):
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey), key_path  # the tokens are ES256
        self.key = key
        self.cert_der = x509.load_pem_x509_certificate(cert_path.read_bytes()).public_bytes(serialization.Encoding.DER)
        self.service, self.issuer, self.users = service, issuer, users
        self.requests: list[tuple[str | None, list[str]]] = []  # (user, scopes), per token asked for
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                query = parse_qs(urlparse(self.path).query)
                user = server._login(self.headers.get("Authorization"))
                server.requests.append((user, query.get("scope", [])))
                if user is False:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": server._token(user or "", query.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.realm = f"http://127.0.0.1:{port}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _login(self, header):
        """None for anonymous, the user name for good credentials, False for bad ones."""
        if not header:
            return None
        user, _, password = base64.b64decode(header.split(" ", 1)[1]).decode().partition(":")
        return user if self.users.get(user) == password else False

    def _token(self, user: str, scopes: list[str]) -> str:
        access = []
        for scope in " ".join(scopes).split():
            kind, name, actions = scope.split(":")
            granted = actions.split(",") if user else [a for a in actions.split(",") if a == "pull"]
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        header = {"alg": "ES256", "typ": "JWT", "x5c": [base64.b64encode(self.cert_der).decode()]}
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": f"{now}-{len(self.requests)}", "access": access}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def close(self):
        self.server.shutdown()
