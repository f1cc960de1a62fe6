"""An in-toto Statement: one type for what we sign about an image and for what we read back.

Writers make one with Statement.about: the bytes signed are its canonical JSON. Readers (verify,
attest's checks, keyless bundles) get one from Statement.read, which checks its shape once: a
list of subjects each with a sha256 digest, a predicateType string, a predicate object, every key
once (as Go's decoder reads it: cosign must see the statement we see). Either way the statement
keeps the bytes it was made from, which are what was signed: compared and shown as they are, never
serialized again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import IntegrityError
from ..files import canonical_json, one_each
from ..oci.refs import Digest, Reference

IN_TOTO_V1 = "https://in-toto.io/Statement/v1"


@dataclass(frozen=True)
class Subject:
    """An in-toto subject: the sha256 of what a statement is about, and its name."""
    sha256: str  # hex, as the statement spells it (not checked to be 64 hex digits: it is compared, never used)
    name: str | None = None


@dataclass(frozen=True, eq=False)
class Statement:
    """An in-toto statement with the bytes it was made or read from."""
    predicate_type: str
    subjects: tuple[Subject, ...]
    predicate: dict
    raw: bytes = field(repr=False)  # the bytes it was made or read from: what is signed

    @classmethod
    def about(cls, subject: Reference, predicate_type: str, predicate: dict) -> Statement:
        """A statement about one image digest, named by its repository."""
        raw = canonical_json({"_type": IN_TOTO_V1, "predicateType": predicate_type, "predicate": predicate,
                              "subject": [{"name": subject.name, "digest": {"sha256": subject.pin.hex}}]},
                             f"the {predicate_type} statement")
        return cls(predicate_type, (Subject(subject.pin.hex, subject.name),), predicate, raw)

    @classmethod
    def read(cls, payload: bytes, what: str) -> Statement:
        """The statement a signed payload holds (its signature is the caller's to check)."""
        try:
            doc = json.loads(payload)
            if not isinstance(doc, dict):
                raise TypeError("not an object")
            kind, subjects, predicate = doc["predicateType"], doc["subject"], doc["predicate"]
            if not isinstance(kind, str) or not isinstance(predicate, dict) or not isinstance(subjects, list):
                raise TypeError("predicateType, predicate or subject of the wrong type")
            # where Go decodes into a struct (the statement, a subject, its digest), keys match without
            # case: each once there; inside the predicate, a free-form map to Go, keys are exact
            for fields in (doc, *subjects, *(s.get("digest") for s in subjects if isinstance(s, dict))):
                if isinstance(fields, dict):
                    one_each(list(fields.items()))
            read = tuple(Subject(s["digest"]["sha256"], s.get("name")) for s in subjects)
            if not all(isinstance(s.sha256, str) and isinstance(s.name, (str, type(None))) for s in read):
                raise TypeError("a subject's digest or name of the wrong type")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise IntegrityError(f"{what}: not an in-toto statement with sha256 subjects ({type(e).__name__}: "
                                 f"{str(e)[:120]})") from None
        return cls(kind, read, predicate, bytes(payload))

    @property
    def digests(self) -> list[str]:
        """Its subjects' sha256 digests, hex."""
        return [s.sha256 for s in self.subjects]

    def names(self, digest: Digest) -> bool:
        """Whether it is about this digest."""
        return digest.algorithm == "sha256" and digest.hex in self.digests


@dataclass(frozen=True)
class Shape:
    """How a predicate's reader (provenance, the smoke result, the VEX) checks each field it reads:
    present with the wrong type is refused, naming the predicate (`what`) and the field; absent is
    None (an empty object or list), or refused too where the reader says `required`."""
    what: str
    required: bool = False

    def refuse(self, where: str, is_not: str) -> IntegrityError:
        return IntegrityError(f"{self.what}: {where} is not {is_not}")

    def obj(self, value, where: str) -> dict:
        if value is None and not self.required:
            return {}
        if not isinstance(value, dict):
            raise self.refuse(where, "an object")
        return value

    def rows(self, value, where: str) -> list:
        if value is None and not self.required:
            return []
        if not isinstance(value, list):
            raise self.refuse(where, "a list")
        return value

    def typed(self, value, kind: type, where: str):
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise self.refuse(where, kind.__name__)
        return value

    def text(self, value, where: str) -> str:
        """A string, present whatever `required` says."""
        if not isinstance(value, str):
            raise self.refuse(where, "a string")
        return value
