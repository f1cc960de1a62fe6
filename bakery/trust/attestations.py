"""The three statements a build record gives about its image: the SBOM, the SLSA provenance and the
VEX. `invoke attest` signs them; the build makes them before it pushes, to fail where attest would.
Apart from attest.py so that the build loads no signature code for them."""

from __future__ import annotations

from ..oci.refs import Reference
from . import provenance, sbom, vex
from .record import BuildRecord
from .statement import Statement

NAMES = {sbom.SPDX_PREDICATE: "SBOM", provenance.SLSA_PREDICATE: "provenance", provenance.VEX_PREDICATE: "VEX"}


def statements(subject: Reference, record: BuildRecord) -> dict[str, bytes]:
    """{predicate type: in-toto statement}, each a view of the record."""
    return {
        sbom.SPDX_PREDICATE: Statement.about(subject, sbom.SPDX_PREDICATE, sbom.predicate(record, subject.name)).raw,
        provenance.SLSA_PREDICATE: Statement.about(subject, provenance.SLSA_PREDICATE, provenance.predicate(record)).raw,
        provenance.VEX_PREDICATE: Statement.about(subject, provenance.VEX_PREDICATE, vex.predicate(record, subject.name)).raw,
    }
