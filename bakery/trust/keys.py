"""Signing keys: ECDSA P-256, the private key encrypted at rest, never written anywhere else."""

from __future__ import annotations

import getpass
import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..errors import InputError
from ..oci.layer import write_blob
from .policy import ROLES

PASSWORD_ENV = "BAKERY_KEY_PASSWORD"
KEY_ENV = "BAKERY_SIGNING_KEY"  # the encrypted PEM itself, for CI secrets: the release role's key
SMOKE_KEY_ENV = "BAKERY_SMOKE_SIGNING_KEY"  # the smoke role's, given only to the MI300X job
REBUILDER_KEY_ENV = "BAKERY_REBUILDER_SIGNING_KEY"  # a rebuilder's, on the machine that rebuilds


def _password(confirm: bool) -> bytes:
    value = os.environ.get(PASSWORD_ENV)
    if value is None:
        if not os.isatty(0):
            raise InputError(f"no key password: set {PASSWORD_ENV} (stdin is not a terminal to prompt on)")
        value = getpass.getpass("key password: ")
        if confirm and getpass.getpass("again: ") != value:
            raise InputError("the passwords differ")
    if not value:
        raise InputError(f"the key password is empty: set {PASSWORD_ENV} to a non-empty value")
    return value.encode()


def generate(directory: Path, role: str = "release") -> tuple[Path, Path]:
    """Write ROLE.key (encrypted PKCS#8 PEM, mode 0600) and ROLE.pub (PEM)."""
    if role not in ROLES:
        raise InputError(f"--role {role!r}: one of {', '.join(ROLES)} (release signs the image, its SBOM and "
                         f"provenance; smoke signs the MI300X smoke result; rebuilder signs an independent rebuild)")
    key_path, pub_path = directory / f"{role}.key", directory / f"{role}.pub"
    if key_path.exists():
        raise InputError(f"{key_path} exists: refusing to overwrite a signing key; move it away first")
    key = ec.generate_private_key(ec.SECP256R1())
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(_password(confirm=True)))
    directory.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)
    try:
        write_blob(key_path, encrypted)
    finally:
        os.umask(old)
    write_blob(pub_path, public_pem(key.public_key()))
    return key_path, pub_path


def load_private(path: Path | None, env: str = KEY_ENV) -> ec.EllipticCurvePrivateKey:
    """From a file, or from the environment (BAKERY_SIGNING_KEY, or the smoke role's) in CI."""
    if path is not None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise InputError(f"cannot read signing key {path}: {e.strerror}") from None
    elif os.environ.get(env):
        data = os.environ[env].encode()
    else:
        raise InputError(f"no signing key: pass --key FILE or set {env} (make one with `invoke keygen`)")
    try:
        key = serialization.load_pem_private_key(data, _password(confirm=False))
    except (ValueError, TypeError):
        raise InputError("cannot decrypt the signing key: wrong password or not a bakery key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise InputError("the signing key is not ECDSA P-256")
    return key


def load_public(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except OSError as e:
        raise InputError(f"cannot read public key {path}: {e.strerror}") from None
    except ValueError:
        raise InputError(f"{path} is not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InputError(f"{path} is not an ECDSA public key")
    return key


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def keyid(key: ec.EllipticCurvePublicKey) -> str:
    """sha256 of the DER SubjectPublicKeyInfo: names the key in DSSE signatures."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


ENV_OF_ROLE = {"release": KEY_ENV, "smoke": SMOKE_KEY_ENV, "rebuilder": REBUILDER_KEY_ENV}


def matches(role: str, public: Path) -> str:
    """The keyid of the role's secret key (from its variable, as a signing job holds it), once its
    public half is the key in `public`; IntegrityError naming both otherwise. A job checks this
    before it signs: a wrong pair is one line there, not a verify failure after the release."""
    from ..errors import IntegrityError

    if role not in ENV_OF_ROLE:
        raise InputError(f"--role {role!r}: one of {', '.join(ROLES)}")
    try:
        published = load_public(public)
    except InputError:
        raise InputError(f"{public} (the {role} public key) is empty or not a PEM public key: set the variable to "
                         f"the {role}.pub `invoke keygen --role {role}` wrote") from None
    held = load_private(None, ENV_OF_ROLE[role]).public_key()
    if keyid(held) != keyid(published):
        raise IntegrityError(f"the {role} key in {ENV_OF_ROLE[role]} is {keyid(held)[:16]}, but the public key given "
                             f"is {keyid(published)[:16]}: signatures would not verify; give the variable the "
                             f"{role}.pub of this very key (or the secret the key of that .pub)")
    return keyid(held)
