"""One Signer; DSSE envelopes (which own their PAE); cosign's simple-signing payload.

Signatures are deterministic ECDSA (RFC 6979): the same bytes and key give the same signature,
so re-signing an image reproduces the same signature manifest.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from ..errors import PARSE_ERRORS, IntegrityError
from ..files import canonical_json, one_each
from ..oci.refs import Digest, Reference
from . import keys

IN_TOTO = "application/vnd.in-toto+json"


def _algorithm() -> ec.ECDSA:
    return ec.ECDSA(hashes.SHA256(), deterministic_signing=True)


@dataclass(frozen=True)
class Signer:
    private_key: ec.EllipticCurvePrivateKey

    @property
    def keyid(self) -> str:
        return keys.keyid(self.private_key.public_key())

    def sign(self, data: bytes) -> bytes:
        """A DER-encoded ECDSA P-256/SHA-256 signature."""
        return self.private_key.sign(data, _algorithm())


def check(public_key: ec.EllipticCurvePublicKey, signature: bytes, data: bytes, what: str) -> None:
    try:
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise IntegrityError(f"{what}: signature does not verify with the given public key "
                             f"(signed with another key, or the signed bytes were changed)") from None


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def envelope(signer: Signer, payload: bytes, payload_type: str = IN_TOTO) -> bytes:
    """A DSSE envelope over exact payload bytes, serialized deterministically."""
    signature = signer.sign(pae(payload_type, payload))
    return canonical_json({"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
                           "signatures": [{"keyid": signer.keyid, "sig": base64.b64encode(signature).decode()}]})


SIGNATURES_LIMIT = 16


def read_envelope(data: bytes, what: str) -> tuple[str, bytes, list]:
    """(payloadType, payload, signatures) of a DSSE envelope, none of it verified yet. Every key of
    `data` once, as cosign's Go decoder reads it (without case): else it could verify another payload
    than ours. (A key-mode bundle's envelope is checked so as it is taken out: bundle.envelope_of.)"""
    try:
        env = json.loads(data, object_pairs_hook=one_each)
        payload = base64.b64decode(env["payload"], validate=True)
        sigs, payload_type = env["signatures"], env["payloadType"]
        if not isinstance(payload_type, str) or not isinstance(sigs, list) or \
                not all(isinstance(s, dict) for s in sigs):
            raise TypeError("malformed fields")
    except PARSE_ERRORS:  # RecursionError too: a layer of 100,000 '[' is one refusal, not a traceback
        raise IntegrityError(f"{what}: not a DSSE envelope") from None
    if len(sigs) > SIGNATURES_LIMIT:  # each is tried (0.05 ms each): 34,000 in each of 256 envelopes, minutes of verify
        raise IntegrityError(f"{what}: the envelope holds {len(sigs)} signatures, past the {SIGNATURES_LIMIT} one "
                             f"may hold (cosign writes one): refused")
    return payload_type, payload, sigs


def open_envelope(data: bytes, public_key, what: str) -> bytes:
    """Verify a DSSE envelope with the key; return its payload bytes."""
    payload_type, payload, sigs = read_envelope(data, what)
    expected = keys.keyid(public_key)
    errors = []
    for s in sigs:
        if s.get("keyid") not in ("", None, expected):
            errors.append(f"keyid {str(s.get('keyid'))[:12]} is not the given key's {expected[:12]}")
            continue
        try:
            check(public_key, base64.b64decode(s.get("sig") or ""), pae(payload_type, payload), what)
            return payload
        except (IntegrityError, ValueError, TypeError) as e:  # a "sig" that is not base64 text
            errors.append(f"{what}: a malformed signature ({type(e).__name__})" if not isinstance(e, IntegrityError)
                          else str(e))
    raise IntegrityError(f"{what}: no valid signature ({'; '.join(errors) or 'none present'})")


def simple_signing_payload(ref: Reference, digest: Digest) -> bytes:
    """cosign's payload for an image signature (Red Hat simple signing, cosign flavour)."""
    body = {"critical": {"identity": {"docker-reference": ref.name},
                         "image": {"docker-manifest-digest": str(digest)},
                         "type": "cosign container image signature"},
            "optional": None}
    return canonical_json(body)
