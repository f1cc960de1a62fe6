"""An image manifest as read from a store: its config and layer descriptors, parsed in one place.

Every manifest bakery reads was written by someone else (a registry, a base's builder, a signer), so
whatever way it fails to parse is one IntegrityError naming the document, never a KeyError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError, malformed
from ..files import go_document
from .refs import MANIFEST_FIELDS, Descriptor


@dataclass(frozen=True)
class Manifest:
    """An OCI image manifest as its reader uses it: config, layers, artifact type, annotations."""
    config: Descriptor
    layers: tuple[Descriptor, ...]
    artifact_type: str | None = None
    annotations: dict = field(default_factory=dict)
    subject: Descriptor | None = None  # the manifest a referrer is about

    @classmethod
    def parse(cls, body: bytes, what: str, layer_limit: int | None = None) -> Manifest:
        """The manifest in body; `what` names it in the error. layer_limit: more layers than that is
        refused too (each would be fetched and checked)."""
        with malformed(what):
            # its own fields and the descriptors' are Go structs (keys without case); annotations are maps
            doc = go_document(body, "the manifest", MANIFEST_FIELDS)
            layers = doc["layers"]
            if not isinstance(layers, list):
                raise TypeError(f"layers is a {type(layers).__name__}, not a list")
            if layer_limit is not None and len(layers) > layer_limit:
                raise ValueError(f"it lists {len(layers)} layers, past the {layer_limit} it may")
            try:
                config, layers = Descriptor.from_json(doc["config"]), tuple(Descriptor.from_json(layer) for layer in layers)
            except InputError as e:  # a descriptor without its digest or size: the document's fault
                raise ValueError(str(e)) from None
            artifact_type, annotations = doc.get("artifactType"), doc.get("annotations") or {}
            if not isinstance(annotations, dict):
                raise TypeError(f"annotations is a {type(annotations).__name__}")
            if not all(isinstance(v, str | None) for v in (artifact_type, doc.get("mediaType"))):
                raise TypeError("its mediaType or artifactType is not a string")
            try:
                subject = None if doc.get("subject") is None else Descriptor.from_json(doc["subject"])
            except InputError as e:
                raise ValueError(f"its subject: {e}") from None
            return cls(config, layers, artifact_type, annotations, subject)

    @property
    def blobs(self) -> tuple[Descriptor, ...]:
        """The config, then the layers: every blob the manifest names."""
        return (self.config,) + self.layers
