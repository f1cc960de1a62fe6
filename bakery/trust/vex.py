"""OpenVEX 0.2.0 of a derived image: what each overlay says of the upstream defect it is about, as a
view of the build record, deterministic to the byte. `invoke attest` signs it with the release key.

- a baked overlay: `fixed`, its impact statement naming the overlay, the patch's sha256, the file it
  gave, and the proof's verdict and code sha256 (or why no proof runs off the hardware);
- an audit record: `not_affected` with the justification its status says (absent or fixed upstream:
  the vulnerable code is not present; not-applicable: it is not in the execute path), where its
  probe holds on this base (or it has none: then the statement says it was recorded by hand);
  `under_investigation` where the probe no longer holds;
- a superseded overlay says nothing: another overlay speaks for its target.
The product is the image (its pkg:oci purl), with the Python distribution whose RECORD lists the
target as subcomponent. A defect upstream names (overlays.yaml's `defect`) is the vulnerability,
with its aliases; one it does not name is named by the overlay in this project's repository.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs.image import rfc3339
from .record import BuildRecord, Overlay
from .sbom import _oci_purl, proof_summary, pypi_purl
from .statement import Shape

CONTEXT = "https://openvex.dev/ns/v0.2.0"  # the spec version this document follows
STATUSES = ("not_affected", "affected", "fixed", "under_investigation")  # OpenVEX 0.2.0's
JUSTIFICATION = {"absent": "vulnerable_code_not_present", "already-upstream": "vulnerable_code_not_present",
                 "not-applicable": "vulnerable_code_not_in_execute_path"}


def _vulnerability(o: Overlay, repository: str) -> dict:
    if o.defect:
        found = {"@id": o.defect["id"], "name": o.defect["id"]}
        if o.defect["aliases"]:
            found["aliases"] = list(o.defect["aliases"])
    else:
        found = {"name": f"{repository}#overlay-{o.id}"}
    return {**found, "description": " ".join(o.reason.split())}


@dataclass(frozen=True)
class Product:
    """What a statement is about (the image), or a subcomponent of it (a Python distribution): its
    @id, and its identifiers where it gives them (None: it gives none)."""
    id: str
    identifiers: dict[str, str] | None
    subcomponents: tuple[Product, ...] = ()

    @classmethod
    def named(cls, purl: str, subcomponents: tuple[Product, ...] = ()) -> Product:
        return cls(purl, {"purl": purl}, subcomponents)

    def to_json(self) -> dict:
        out: dict = {"@id": self.id}
        if self.identifiers is not None:
            out["identifiers"] = dict(self.identifiers)
        if self.subcomponents:
            out["subcomponents"] = [c.to_json() for c in self.subcomponents]
        return out

    @property
    def named_once(self) -> bool:
        """Its identifiers, where given, are its @id as a purl and nothing else."""
        return self.identifiers is None or self.identifiers == {"purl": self.id}


@dataclass(frozen=True)
class VexStatement:
    """One VEX statement as verify judges it: its status and the products it is about."""
    status: str
    products: tuple[Product, ...]


@dataclass(frozen=True, eq=False)
class Vex:
    """An OpenVEX document as verify reads it back (the statements' status and products, typed; a
    field absent or of the wrong type is refused), and the document itself."""
    statements: tuple[VexStatement, ...]
    document: dict

    @classmethod
    def read(cls, doc, what: str = "the VEX") -> Vex:
        shape = Shape(what, required=True)  # what is read here must be there
        obj, rows, text = shape.obj, shape.rows, shape.text

        def product(value, where: str, top: bool = True) -> Product:
            value = obj(value, where)
            identifiers = value.get("identifiers")
            if identifiers is not None:
                identifiers = {k: text(v, f"{where}'s identifier") for k, v in obj(identifiers, where).items()}
            # a subcomponent's own subcomponents are no field of OpenVEX's: ignored, as its Go reader does
            subcomponents = tuple(product(c, "a subcomponent", False) for c in
                                  rows(value.get("subcomponents", []), "the subcomponents")) if top else ()
            return Product(text(value.get("@id"), f"{where}'s @id"), identifiers, subcomponents)

        statements = []
        for s in rows(obj(doc, "the document").get("statements"), "the statements"):
            s = obj(s, "a statement")
            statements.append(VexStatement(text(s.get("status"), "a statement's status"),
                                           tuple(product(p, "a product") for p in rows(s.get("products"), "the products"))))
        return cls(tuple(statements), doc)


def _product(o: Overlay, image_purl: str) -> dict:
    owner = o.owner
    return Product.named(image_purl, (Product.named(pypi_purl(owner["distribution"], owner["version"])),)
                         if owner else ()).to_json()


def statement(o: Overlay, image_purl: str, record: BuildRecord) -> dict | None:
    """The overlay's statement about the image, or None (superseded: it says nothing)."""
    if o.status == "superseded":
        return None
    said = {"vulnerability": _vulnerability(o, record.source.repository),
            "products": [_product(o, image_purl)]}
    if o.baked:
        said["status"] = "fixed"
        said["impact_statement"] = (f"fixed by overlay {o.id}: patch {o.patch} (sha256 {o.patch_sha256}) applied to "
                                    f"{o.target} (sha256 {o.base_sha256 or 'none: a new file'}), giving sha256 "
                                    f"{o.result_sha256}; {proof_summary(o.proof)}")
    elif o.audit and not o.audit["holds"]:  # what the record says is no longer true of this base
        said["status"] = "under_investigation"
        said["status_notes"] = f"audit record {o.id} ({o.status}): its probe {o.audit['detail']}"
    else:
        said["status"] = "not_affected"
        said["justification"] = JUSTIFICATION[o.status]
        checked = f"its probe holds on this base ({o.audit['detail']})" if o.audit else \
            "no probe checks it on a base: recorded by hand"
        said["impact_statement"] = f"audit record {o.id} ({o.status}), {checked}: " + " ".join(o.reason.split())
    return said


def predicate(record: BuildRecord, image_name: str) -> dict:
    """The OpenVEX document for the image the record describes; image_name is where it was pushed."""
    digest = str(record.manifest.digest)
    image_purl = _oci_purl(image_name, digest)
    statements = [s for s in (statement(o, image_purl, record) for o in record.overlays) if s]
    doc = {
        "@context": CONTEXT,
        "@id": f"{record.source.repository}/vex/{digest.replace(':', '-')}",
        "author": record.source.repository,
        "role": "release",
        "timestamp": rfc3339(record.source.source_date_epoch),
        "version": 1,
        "tooling": f"bakery-{record.tools['bakery']}",
        "statements": statements,
    }
    return doc
