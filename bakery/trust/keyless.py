"""Keyless signing: Sigstore bundles whose certificate names the workflow identity that signed.

Each role is one GitHub workflow (build-and-sign, smoke, rebuild), so a Fulcio certificate's Build
Signer URI says which role signed: separation of duties rests on identities GitHub asserts, not on
who holds which key. The chain to the trusted root, the SCT, the transparency log's inclusion proof
and signed entry timestamp, and the DSSE signature are checked by sigstore-python, offline, against
the trusted_root.json the policy ships; what the identity must be is ours (RoleIdentity).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import PARSE_ERRORS, InputError, IntegrityError
from ..files import one_each
from .statement import Statement

GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
ISSUER_V2 = "1.3.6.1.4.1.57264.1.8"
BUILD_SIGNER_URI = "1.3.6.1.4.1.57264.1.9"
SOURCE_REPOSITORY_URI = "1.3.6.1.4.1.57264.1.12"
SOURCE_REPOSITORY_REF = "1.3.6.1.4.1.57264.1.14"
BUILD_TRIGGER = "1.3.6.1.4.1.57264.1.20"


@dataclass(frozen=True)
class RoleIdentity:
    """Who may sign for a role without a key: the OIDC issuer, the repository (OWNER/NAME), the
    workflow file that must have run the job, and the git ref it ran on (a shell-style pattern)."""
    role: str
    issuer: str
    repository: str
    workflow: str
    ref: str
    trigger: str = "push"  # the event that ran it: a tag pushed, not a dispatch anyone with write access can start

    @property
    def signer_uri(self) -> str:
        """The Build Signer URI pattern: https://github.com/OWNER/NAME/WORKFLOW@REF."""
        return f"https://github.com/{self.repository}/{self.workflow}@{self.ref}"

    def check(self, cert) -> str:
        """The certificate's Build Signer URI if it is this identity's; IntegrityError naming the
        first claim that is not."""
        claims = {oid: _extension(cert, oid) for oid in (ISSUER_V2, BUILD_SIGNER_URI, SOURCE_REPOSITORY_URI,
                                                         SOURCE_REPOSITORY_REF, BUILD_TRIGGER)}
        signer, ref = claims[BUILD_SIGNER_URI] or "", claims[SOURCE_REPOSITORY_REF] or ""
        # only the ref is a pattern; the signer is exactly this workflow at the ref the job ran on
        wanted = [(claims[ISSUER_V2] == self.issuer, f"issuer {claims[ISSUER_V2]}, not {self.issuer}"),
                  (claims[SOURCE_REPOSITORY_URI] == f"https://github.com/{self.repository}",
                   f"repository {claims[SOURCE_REPOSITORY_URI]}, not https://github.com/{self.repository}"),
                  (fnmatch.fnmatchcase(ref, self.ref), f"ref {ref or '(none)'}, not {self.ref}"),
                  (signer == f"https://github.com/{self.repository}/{self.workflow}@{ref}",
                   f"workflow {signer or '(none)'}, not the {self.role} role's {self.signer_uri}"),
                  (claims[BUILD_TRIGGER] == self.trigger, f"run by a {claims[BUILD_TRIGGER]} event, not {self.trigger}")]
        failed = [why for ok, why in wanted if not ok]
        if failed:
            raise IntegrityError(f"signed by {signer or 'an unnamed identity'}, not the {self.role} role's identity: "
                                 f"{failed[0]}")
        return signer


def _extension(cert, oid: str) -> str | None:
    """A Fulcio extension's text (DER UTF8String), None where absent or not one."""
    from cryptography import x509

    try:
        raw = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value.value
    except x509.ExtensionNotFound:
        return None
    if len(raw) < 2 or raw[0] != 0x0C:
        return None
    length, at = raw[1], 2
    if length & 0x80:  # long form: the next (length & 0x7f) bytes
        count = length & 0x7F
        length, at = int.from_bytes(raw[2:2 + count], "big"), 2 + count
    body = raw[at:at + length]
    return body.decode("utf-8", "replace") if len(body) == length and at + length == len(raw) else None


ROLE_KEYS = {"issuer", "repository", "workflow", "ref"}
PATTERN = set("*?[]")


def load_identities(doc: dict | None, path: Path) -> tuple[dict[str, RoleIdentity], Path | None]:
    """The policy's `keyless` section: ({role: RoleIdentity}, the trusted root file)."""
    if not doc:
        return {}, None
    if not isinstance(doc, dict) or set(doc) - {"trusted_root", "roles"} or not isinstance(doc.get("roles"), dict):
        raise InputError(f"{path}: keyless must be {{trusted_root: FILE, roles: {{ROLE: {{issuer, repository, "
                         f"workflow, ref}}}}}}")
    identities = {}
    for role, entry in doc["roles"].items():
        if not isinstance(entry, dict) or not ROLE_KEYS <= set(entry) <= ROLE_KEYS | {"trigger"} or \
                not all(isinstance(v, str) and v for v in entry.values()):
            raise InputError(f"{path}: keyless.roles.{role} must give {', '.join(sorted(ROLE_KEYS))} (and may give "
                             f"trigger), each a string")
        exact = [k for k in ("issuer", "repository", "workflow", "trigger") if PATTERN & set(entry.get(k, ""))]
        if exact or set("?[]") & set(entry["ref"]):
            raise InputError(f"{path}: keyless.roles.{role}: only ref may be a pattern, and only with '*' "
                             f"({', '.join(exact) or 'ref'} has a pattern character)")
        identities[role] = RoleIdentity(role, **entry)
    workflows = [(i.repository, i.workflow) for i in identities.values()]
    if len(set(workflows)) != len(workflows):
        raise InputError(f"{path}: keyless.roles: two roles name the same workflow; one identity vouches for one thing")
    root = doc.get("trusted_root")
    if not isinstance(root, str):
        raise InputError(f"{path}: keyless.trusted_root must name the trusted_root.json shipped with the policy")
    return identities, Path(path).parent / root


def bundle_statement(data: bytes, what: str) -> Statement:
    """The in-toto statement inside a keyless bundle, unverified (it says which role must have signed)."""
    import base64

    try:
        payload = base64.b64decode(json.loads(data, object_pairs_hook=one_each)["dsseEnvelope"]["payload"],
                                   validate=True)
    except PARSE_ERRORS as e:
        raise IntegrityError(f"{what}: not a DSSE bundle of an in-toto statement ({type(e).__name__})") from None
    return Statement.read(payload, what)


class _Checked:
    """sigstore-python's policy protocol around a check(cert) of ours: verify(cert) raises its
    VerificationError; what the check returns is kept (the signer's URI)."""

    def __init__(self, check):
        self.check, self.seen = check, ""

    def verify(self, cert) -> None:
        from sigstore.errors import VerificationError

        try:
            self.seen = self.check(cert) or ""
        except IntegrityError as e:
            raise VerificationError(str(e)) from None


def _verified(data: bytes, policy, trusted_root: Path | None, what: str, artifact: bytes | None = None) -> bytes:
    """The signed payload of a bundle sigstore-python verifies, offline: the certificate chain to
    `trusted_root` (None: the public instance's root sigstore-python ships), the SCT, the log
    entry's inclusion proof and signed entry timestamp or checkpoint, the signature, and `policy`
    on the certificate. A DSSE bundle gives its payload; a message signature must be over
    `artifact` and gives it back. IntegrityError, one line, otherwise."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle, ClientTrustConfig, TrustedRoot
    from sigstore.verify import Verifier

    try:
        root = TrustedRoot.from_file(str(trusted_root)) if trusted_root else \
            ClientTrustConfig.production(offline=True).trusted_root
    except (OSError, ValueError, SigstoreError) as e:
        raise InputError(f"trusted root {trusted_root} cannot be read: {_said(e)}") from None
    try:
        bundle = Bundle.from_json(data)
        verifier = Verifier(trusted_root=root)
        if bundle._dsse_envelope is not None:
            payload_type, payload = verifier.verify_dsse(bundle, policy)
            if payload_type != "application/vnd.in-toto+json":
                raise IntegrityError(f"{what}: payloadType {_said(ValueError(payload_type))}, not "
                                     f"application/vnd.in-toto+json")
            return payload
        if artifact is None:
            raise IntegrityError(f"{what}: a message signature, not a DSSE envelope: bakery signs statements")
        verifier.verify_artifact(artifact, bundle, policy)
        return artifact
    except IntegrityError:
        raise
    except Exception as e:  # whatever a hostile bundle makes the library raise is a refusal
        raise IntegrityError(f"{what}: {_said(e)}") from None


def open_bundle(data: bytes, identity: RoleIdentity, trusted_root: Path, what: str) -> tuple[bytes, str]:
    """(the signed payload, the signer's URI) of a keyless DSSE bundle that verifies offline against
    the trusted root and was signed by `identity`; IntegrityError naming what failed otherwise."""
    policy = _Checked(identity.check)
    return _verified(data, policy, trusted_root, what), policy.seen


def verify_bundle(data: bytes, artifact: bytes, identity: str, issuer: str, trusted_root: Path | None) -> None:
    """A bundle as sigstore-conformance's cases pose it: signed by exactly `identity` (the
    certificate's SAN) from `issuer`, over `artifact` (for an in-toto statement: its subject's
    sha256); IntegrityError otherwise. The same verification as open_bundle's, by another policy."""
    import hashlib

    def exact(cert) -> str:
        from cryptography import x509

        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            raise IntegrityError("the certificate names no identity") from None
        names = sans.get_values_for_type(x509.UniformResourceIdentifier) + sans.get_values_for_type(x509.RFC822Name)
        if identity not in names or _extension(cert, ISSUER_V2) != issuer:
            raise IntegrityError(f"signed by {', '.join(names) or '(none)'} from {_extension(cert, ISSUER_V2)}, not "
                                 f"{identity} from {issuer}")
        return identity

    payload = _verified(data, _Checked(exact), trusted_root, "bundle", artifact)
    if payload is artifact:
        return
    subjects = Statement.read(payload, "bundle").digests
    if hashlib.sha256(artifact).hexdigest() not in subjects:
        raise IntegrityError("bundle: its statement is about other bytes than the artifact")


@dataclass(frozen=True)
class KeylessSigner:
    """Signs as the workflow identity an OIDC token names (attest takes it where it takes a key)."""
    token: str
    trust_config: Path | None  # None: the public Sigstore instance's, fetched by TUF

    def bundle(self, statement: bytes) -> bytes:
        return sign_statement(statement, self.token, self.trust_config)


def ambient_signer(trust_config: Path | None) -> KeylessSigner:
    """The signer of this job: the token in SIGSTORE_ID_TOKEN (as cosign takes it), else the one
    GitHub Actions gives a job with `id-token: write` (sigstore-python asks for it)."""
    import os

    token = os.environ.get("SIGSTORE_ID_TOKEN")
    if not token:
        from sigstore.errors import Error as SigstoreError
        from sigstore.oidc import detect_credential

        try:
            token = detect_credential()
        except (SigstoreError, OSError, ValueError) as e:
            raise InputError(f"--keyless: no OIDC token: set SIGSTORE_ID_TOKEN, or run in a GitHub Actions job "
                             f"with `permissions: id-token: write` ({str(e).splitlines()[0][:200]})") from None
        if not token:
            raise InputError("--keyless: no OIDC token: set SIGSTORE_ID_TOKEN, or run in a GitHub Actions job with "
                             "`permissions: id-token: write`")
    return KeylessSigner(token, trust_config)


def sign_statement(statement: bytes, token: str, trust_config: Path | None) -> bytes:
    """A keyless bundle over an in-toto statement: an ephemeral key, its Fulcio certificate for the
    identity in `token`, the signature entered in Rekor; the services and root from `trust_config`
    (sigstore's ClientTrustConfig JSON; None: the public instance's, by TUF)."""
    from sigstore import dsse
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityToken
    from sigstore.sign import SigningContext

    try:
        config = ClientTrustConfig.from_json(Path(trust_config).read_text()) if trust_config else \
            ClientTrustConfig.production()
        context = SigningContext.from_trust_config(config)
        with context.signer(IdentityToken(token)) as signer:
            return signer.sign_dsse(dsse.Statement(statement)).to_json().encode()
    except OSError as e:
        raise InputError(f"trust config {trust_config} cannot be read ({e.strerror})") from None
    except (SigstoreError, ValueError) as e:
        raise IntegrityError(f"keyless signing failed: {_said(e)}") from None


def _said(e: Exception) -> str:
    """A library's error, as one printable line of at most 300 characters."""
    from .. import untrusted

    return untrusted.safe(str(e).splitlines()[0] if str(e) else type(e).__name__, limit=300)
