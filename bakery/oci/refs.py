"""Names and digests: parsed once, passed around as typed values."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from ..errors import InputError

DOCKER_HUB = "docker.io"
_HEX = {"sha256": 64, "sha512": 128}
# whole names only (fullmatch): `$` would also match before a trailing newline
_REPO_RE = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True, order=True)
class Digest:
    """A content address such as sha256:<64 hex>."""

    algorithm: str
    hex: str

    @classmethod
    def parse(cls, text: str) -> Digest:
        alg, sep, hexpart = text.partition(":")
        if not sep or alg not in _HEX or len(hexpart) != _HEX[alg] or not re.fullmatch(r"[0-9a-f]+", hexpart):
            raise InputError(f"not a digest: {text!r} (expected sha256:<64 lowercase hex>)")
        return cls(alg, hexpart)

    @classmethod
    def of(cls, data: bytes) -> Digest:
        return cls("sha256", hashlib.sha256(data).hexdigest())

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"


# the fields of the OCI image spec's structs, as its Go readers (containerd, cosign, skopeo) decode them
DESCRIPTOR_FIELDS = frozenset({"mediaType", "digest", "size", "urls", "annotations", "data", "platform", "artifactType"})
PLATFORM_FIELDS = frozenset({"architecture", "os", "os.version", "os.features", "variant", "features"})
MANIFEST_FIELDS = frozenset({"schemaVersion", "mediaType", "artifactType", "config", "layers", "manifests", "subject",
                             "annotations"})  # an index's fields with an image manifest's: one reader for both


@dataclass(frozen=True)
class Descriptor:
    """What OCI calls a descriptor: media type, digest and size of one blob or manifest."""

    media_type: str
    digest: Digest
    size: int
    annotations: dict = field(default_factory=dict, compare=False)
    platform: dict | None = field(default=None, compare=False)

    @classmethod
    def of(cls, media_type: str, data: bytes, annotations: dict | None = None) -> Descriptor:
        return cls(media_type, Digest.of(data), len(data), dict(annotations or {}))

    @classmethod
    def from_json(cls, obj: dict) -> Descriptor:
        from ..files import go_struct

        try:
            size = go_struct(obj, "the descriptor", DESCRIPTOR_FIELDS)["size"]
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:  # Go's int64, a length
                raise TypeError(f"size {size!r} is not an integer from 0 to 2^63 - 1")
            annotations = obj.get("annotations") or {}
            if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
                raise TypeError("annotations is not an object of strings")  # Go's map[string]string
            if not isinstance(obj["mediaType"], str) or not isinstance(obj["digest"], str):
                raise TypeError("its mediaType or digest is not a string")
            return cls(obj["mediaType"], Digest.parse(obj["digest"]), size, dict(annotations),
                       go_struct(obj.get("platform"), "its platform", PLATFORM_FIELDS))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"malformed descriptor ({e}): {str(obj)[:200]}") from None

    def to_json(self) -> dict:
        out = {"mediaType": self.media_type, "digest": str(self.digest), "size": self.size}
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        if self.platform:
            out["platform"] = self.platform
        return out


def check_tag(tag: str, what: str = "tag") -> str:
    """A tag as registries take it (the distribution spec's grammar: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127});
    InputError otherwise. `v1.0.0+b1` is no tag: semver's build metadata has a '+'."""
    if not _TAG_RE.fullmatch(tag):
        raise InputError(f"{what} {tag!r} is not one a registry takes (letters, digits, '_', '.' and '-', at most "
                         f"128, not starting with '.' or '-'): refused")
    return tag


@dataclass(frozen=True)
class Reference:
    """registry/repository[:tag][@digest], with Docker Hub's short names made explicit."""

    registry: str
    repository: str
    tag: str | None = None
    digest: Digest | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        original = text.strip()
        if not original or any(c.isspace() for c in original):
            raise InputError(f"not an image reference: {text!r}")
        rest, digest = original, None
        if "@" in rest:
            rest, _, d = rest.partition("@")
            digest = Digest.parse(d)
        tag = None
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            rest, _, tag = rest.rpartition(":")
            if not _TAG_RE.fullmatch(tag):
                raise InputError(f"bad tag {tag!r} in {text!r}")
        first, slash, remainder = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, repository = first, remainder
        else:
            registry, repository = DOCKER_HUB, rest
            if "/" not in repository:
                repository = f"library/{repository}"
        if not _REPO_RE.fullmatch(repository):
            raise InputError(f"bad repository name {repository!r} in {text!r} (lowercase letters, digits, . _ - /)")
        return cls(registry, repository, tag, digest)

    @classmethod
    def parse_pinned(cls, text: str, what: str = "reference") -> Reference:
        """Parse a reference that must carry a digest: tags move, digests do not."""
        ref = cls.parse(text)
        if ref.digest is None:
            raise InputError(
                f"{what} {text!r} has no digest: pin it as NAME@sha256:<digest> "
                f"(find it with `skopeo inspect docker://{text}` or `docker buildx imagetools inspect`)")
        return ref

    @property
    def pin(self) -> Digest:
        """The digest of a reference that must carry one (as parse_pinned's do); else an input error."""
        if self.digest is None:
            raise InputError(f"{self} has no digest: pin it as NAME@sha256:<digest>")
        return self.digest

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def with_digest(self, digest: Digest) -> Reference:
        return Reference(self.registry, self.repository, None, digest)

    def with_tag(self, tag: str | None) -> Reference:
        return Reference(self.registry, self.repository, tag, None)

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out
