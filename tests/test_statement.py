"""The in-toto statement, one type for writer and reader (issue 54 item 2): what is written reads
back as the same value, the bytes read are kept as they came (they are what was signed), and a
statement two readers would read differently is refused."""

from __future__ import annotations

import json

import pytest

from bakery.errors import IntegrityError
from bakery.oci.refs import Reference
from bakery.trust import provenance
from bakery.trust.statement import Statement, Subject

REF = Reference.parse("127.0.0.1:5000/bakery/image@sha256:" + "ab" * 32)


def test_a_written_statement_reads_back_as_the_same_value():
    predicate = {"runDetails": {"builder": {"id": "local"}}, "ü": [1, 2.5, None]}
    written = Statement.about(REF, provenance.SLSA_PREDICATE, predicate)
    read = Statement.read(written.raw, "statement")
    assert (read.predicate_type, read.subjects, read.predicate, read.raw) == \
        (written.predicate_type, written.subjects, written.predicate, written.raw)
    assert read.subjects == (Subject("ab" * 32, "127.0.0.1:5000/bakery/image"),) and read.names(REF.pin)
    # what the in-toto spec says a statement is, read independently of the type
    doc = json.loads(written.raw)
    assert doc == {"_type": "https://in-toto.io/Statement/v1", "predicateType": provenance.SLSA_PREDICATE,
                   "predicate": predicate, "subject": [{"name": REF.name, "digest": {"sha256": "ab" * 32}}]}


def test_a_statement_read_keeps_the_bytes_it_came_in():
    """Another signer's spacing and key order: kept as signed, never serialized again."""
    payload = (b'{ "subject" : [ {"digest": {"sha256": "' + b"ab" * 32 + b'"}} ],\n'
               b'  "predicate": {"b": 1, "a": 2}, "predicateType": "x", "_type": "https://in-toto.io/Statement/v1" }')
    read = Statement.read(payload, "statement")
    assert read.raw == payload and read.predicate == {"b": 1, "a": 2} and read.subjects == (Subject("ab" * 32),)


@pytest.mark.parametrize("payload, why", [
    (b'{"predicateType": "a", "PredicateType": "b", "predicate": {}, "subject": []}', "twice"),
    (b'{"predicateType": "a", "predicate": {}, "subject": [{"digest": {"sha256": "00", "SHA256": "11"}}]}', "twice"),
    (b'{"predicateType": "a", "predicate": [], "subject": []}', "wrong type"),
    (b'{"predicateType": 7, "predicate": {}, "subject": []}', "wrong type"),
    (b'{"predicateType": "a", "predicate": {}, "subject": [{"digest": {"sha512": "00"}}]}', "KeyError"),
    (b'{"predicateType": "a", "predicate": {}, "subject": [{"digest": {"sha256": 5}}]}', "wrong type"),
    (b'{"predicateType": "a", "predicate": {}}', "KeyError"),
    (b"[]", "TypeError"),
    (b"\xff", "UnicodeDecodeError"),
], ids=["type in two cases", "digest in two cases", "predicate a list", "type a number", "no sha256",
        "digest a number", "no subject", "not an object", "not UTF-8"])
def test_a_statement_of_another_shape_is_refused_in_one_line(payload, why):
    """A key in two cases is read one way by Go's encoding/json (keys matched without case, the last
    kept: tests/test_prune.py shows skopeo doing so), not at all by cosign 3 (tests/test_bundles.py),
    and by Python's json as the exact key: readers that disagree, so it is refused."""
    with pytest.raises(IntegrityError, match=why) as raised:
        Statement.read(payload, "attestation x")
    assert str(raised.value).startswith("attestation x: not an in-toto statement") and "\n" not in str(raised.value)


def _envelope(payload: bytes, twice: str = "") -> bytes:
    """A DSSE envelope of `payload`; `twice`: that field written again in capitals, with other bytes."""
    import base64

    fields = [("payload", base64.b64encode(payload).decode()), ("payloadType", "application/vnd.in-toto+json"),
              ("signatures", [{"keyid": "", "sig": "AAAA"}])]
    if twice:
        fields.append((twice.upper(), base64.b64encode(b'{"other": 1}').decode() if twice == "payload" else "x"))
    return ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in fields) + "}").encode()


STATEMENT = Statement.about(REF, provenance.SLSA_PREDICATE, {}).raw


def test_the_envelopes_around_a_statement_are_refused_with_a_key_in_two_cases():
    """Found by stop 61's review: the DSSE envelope, a keyless bundle's envelope and cosign's
    simple-signing payload are Go structs to cosign (keys matched without case, the last kept), so
    an envelope with `payload` and `PAYLOAD` is verified by cosign over the one and read by us from
    the other. Each is refused, as the statement inside already was; written once, each reads."""
    from bakery.trust import keyless, sign, verify

    assert sign.read_envelope(_envelope(STATEMENT), "att")[1] == STATEMENT
    for field in ("payload", "payloadType", "signatures"):
        with pytest.raises(IntegrityError, match="not a DSSE envelope"):
            sign.read_envelope(_envelope(STATEMENT, field), "att")

    bundle = b'{"dsseEnvelope": ' + _envelope(STATEMENT) + b"}"
    assert keyless.bundle_statement(bundle, "b").raw == STATEMENT
    for twice in (b'{"dsseEnvelope": ' + _envelope(STATEMENT, "payload") + b"}",
                  bundle[:-1] + b', "DSSEENVELOPE": ' + _envelope(b'{"other": 1}') + b"}"):
        with pytest.raises(IntegrityError, match="not a DSSE bundle"):
            keyless.bundle_statement(twice, "b")

    digest = "sha256:" + "ab" * 32
    simple = {"critical": {"identity": {"docker-reference": REF.name}, "image": {"docker-manifest-digest": digest},
                           "type": "cosign container image signature"}, "optional": None}
    assert verify.simple_signing_claims(json.dumps(simple).encode()) == (digest, REF.name)
    other = json.dumps(simple)[:-1] + ', "Critical": {"identity": {"docker-reference": "x"}, "image": ' \
        '{"docker-manifest-digest": "sha256:' + "cd" * 32 + '"}}}'
    with pytest.raises(ValueError, match="twice in different cases"):
        verify.simple_signing_claims(other.encode())
    # `optional` is a map to Go, keys exact: annotations differing in case alone are another signer's right
    annotated = {**simple, "optional": {"env": "prod", "Env": "x"}}
    assert verify.simple_signing_claims(json.dumps(annotated).encode()) == (digest, REF.name)


def test_a_key_mode_bundle_with_its_payload_twice_is_refused():
    """Found by this stop's review: parsed plainly, a bundle's envelope with `payload` written twice
    kept the last one and was written out again with one key, so read_envelope never saw the two."""
    from bakery.trust import bundle, sign

    whole = bundle.of_envelope(_envelope(STATEMENT))
    assert sign.read_envelope(bundle.envelope_of(whole, "b"), "b")[1] == STATEMENT
    twice = whole.replace(b'"payload":', b'"payload":"e30=","payload":', 1)
    with pytest.raises(IntegrityError, match="twice"):
        bundle.envelope_of(twice, "b")


def test_a_document_nested_past_pythons_recursion_is_one_refusal():
    """Found by this stop's review: a layer of 100,000 '[' pushed beside the signatures made verify
    end in a traceback (RecursionError) instead of naming one unreadable layer."""
    from bakery.errors import PARSE_ERRORS
    from bakery.trust import keyless, sign, verify

    deep = b"[" * 100_000
    with pytest.raises(IntegrityError, match="not a DSSE envelope"):
        sign.read_envelope(deep, "att")
    with pytest.raises(IntegrityError, match="not a DSSE bundle"):
        keyless.bundle_statement(deep, "b")
    with pytest.raises(PARSE_ERRORS):  # its caller notes the layer unreadable and goes on
        verify.simple_signing_claims(deep)
    from bakery.trust import bundle

    assert bundle.is_keyless(deep) is False  # then envelope_of refuses it, one unreadable bundle


def test_inside_the_predicate_keys_are_exact_as_in_a_go_map():
    """The predicate is a free-form map to Go's decoder (no matching without case there): a smoke
    report's tool names or a tools table may hold keys differing only in case."""
    read = Statement.read(b'{"predicateType": "a", "predicate": {"x": 1, "X": 2}, "subject": []}', "s")
    assert read.predicate == {"x": 1, "X": 2}


# -- the SLSA provenance: verify, reproduce and prune read it through one type -----------------------

def test_the_provenance_written_reads_back_as_what_its_record_says():
    from pathlib import Path

    from bakery.trust import record

    rec = record.read(Path(__file__).parent / "data" / "build-record.json")
    written = provenance.Provenance.of(rec)
    read = provenance.Provenance.read(json.loads(Statement.about(REF, provenance.SLSA_PREDICATE,
                                                                 written.document).raw)["predicate"])
    assert (read.base, read.repository, read.revision, read.dirty, read.source_date_epoch, read.builder) == \
        (str(rec.base.pinned), rec.source.repository, rec.source.revision, rec.source.dirty,
         rec.source.source_date_epoch, rec.builder.id)
    assert read.dependencies == written.dependencies and read.byproducts == written.byproducts
    assert read.base_digests == {f"sha256:{rec.base.pinned.pin.hex}", str(rec.base.manifest_digest)}
    assert f"docker://{rec.base.pinned}" in read.uris


@pytest.mark.parametrize("predicate, why", [
    ({"buildDefinition": {"externalParameters": {"source": {"dirty": "no"}}}}, "dirty is not bool"),
    ({"buildDefinition": {"externalParameters": {"sourceDateEpoch": True}}}, "sourceDateEpoch is not int"),
    ({"buildDefinition": {"externalParameters": {"base": ["x"]}}}, "the base is not str"),
    ({"buildDefinition": {"resolvedDependencies": [{"name": "base image", "digest": {"sha256": 1}}]}}, "sha256"),
    ({"buildDefinition": {"resolvedDependencies": {}}}, "not a list"),
    ({"runDetails": {"builder": "local"}}, "the builder is not an object"),
    ({"buildDefinition": {}, "BuildDefinition": {"externalParameters": {"base": "x"}}}, "twice"),
], ids=["dirty a string", "epoch a bool", "base a list", "digest a number", "dependencies an object", "builder a string",
        "a field in two cases"])
def test_a_provenance_field_of_the_wrong_type_is_refused(predicate, why):
    """Before, a dirty of "no" read as a clean checkout to reproduce and as dirty to verify."""
    with pytest.raises(IntegrityError, match=why):
        provenance.Provenance.read(predicate, "attestation x")


def test_an_absent_field_reads_as_absent_and_each_reader_says_what_it_needs():
    read = provenance.Provenance.read({})
    assert (read.base, read.revision, read.dirty, read.builder, read.dependencies) == (None, None, None, "", ())
    from bakery.release import reproduce

    with pytest.raises(IntegrityError, match="lacks its source, base or sourceDateEpoch"):
        reproduce.plan(read)


# -- the smoke result: `invoke smoke` writes it and verify reads it through one type ------------------

def test_the_smoke_result_written_reads_back_as_its_report_says():
    import hashlib

    from bakery.release import smoke_report
    from bakery.trust.smoke_result import SmokeResult
    from support import ROOT, passing_report

    spec = (ROOT / "provenance" / "smoke.yaml").read_bytes()
    report = passing_report(str(REF), workflow_run="o/r#2", finished="2026-12-07T01:00:00Z", run=3,
                            host={"gfx_arch": "gfx942", "compute_units": 304, "driver_version": "6.10.5",
                                  "rocm_version": "7.0.0"})
    read = SmokeResult.read(Statement.read(smoke_report.statement(REF, report, spec), "s").predicate)
    assert (read.result, read.report_result, read.spec_sha256, read.compared, read.reference_kind) == \
        ("PASSED", "PASSED", hashlib.sha256(spec).hexdigest(), {"dspark": 240, "native": 240}, "seed-stack")
    assert (read.passed, read.ran_ab, read.launched_both) == (True, True, True)
    assert (read.workflow_run, read.finished, read.run, read.report) == ("o/r#2", "2026-12-07T01:00:00Z", 3, report)
    assert read.summary == "PASSED on gfx942, 304 CUs, driver 6.10.5, ROCm 7.0.0"


@pytest.mark.parametrize("report, ran_ab, launched_both", [
    ({"result": "PASSED"}, False, False),  # the hollow PASSED the smoke signed before the gate
    ({"ab": {"paths": [{"path": "dspark", "compared": 240}]}, "reference": {"kind": "seed-stack"}}, False, False),
    ({"ab": {"paths": [{"path": "dspark", "compared": 240}, {"path": "native", "compared": 0}]},
      "reference": {"kind": "promoted"}}, False, False),
    ({"ab": {"paths": [{"path": "dspark", "compared": 1}, {"path": "native", "compared": 1}]},
      "reference": {"kind": "a-friend"}}, False, False),
    ({"launched": {"candidate": True, "reference": False}}, False, False),
    ({"ab": {"paths": [{"path": "dspark", "compared": 1}, {"path": "native", "compared": 1}]},
      "reference": {"kind": "endpoint"}, "launched": {"candidate": True, "reference": True}}, True, True),
], ids=["no A/B", "one path", "a path compared nothing", "an unknown reference", "the reference not launched",
        "both"])
def test_the_ab_and_the_launch_are_judged_from_the_typed_report(report, ran_ab, launched_both):
    from bakery.trust.smoke_result import SmokeResult

    read = SmokeResult.read({"result": "PASSED", "report": report})
    assert (read.ran_ab, read.launched_both) == (ran_ab, launched_both)


@pytest.mark.parametrize("predicate, why", [
    ({"result": True}, "the result is not str"),
    ({"report": ["x"]}, "the report is not an object"),
    ({"configuration": {"name": "provenance/smoke.yaml"}}, "the configuration is not a list"),
    ({"configuration": [{"name": "provenance/smoke.yaml", "digest": {"sha256": 7}}]}, "a configuration sha256"),
    ({"report": {"ab": {"paths": [{"path": "dspark", "compared": "240"}]}}}, "an A/B count is not int"),
    ({"report": {"ab": {"paths": [{"path": "dspark", "compared": True}]}}}, "an A/B count is not int"),
    ({"report": {"launched": {"candidate": "yes"}}}, "launched candidate is not bool"),
    ({"report": {"host": {"compute_units": 304.0}}}, "compute_units is not int"),
    ({"report": {"run": "7"}}, "the run is not int"),
], ids=["result a bool", "report a list", "configuration an object", "spec digest a number", "count a string",
        "count a bool", "launched a string", "CUs a float", "run a string"])
def test_a_smoke_result_field_of_the_wrong_type_is_refused(predicate, why):
    from bakery.trust.smoke_result import SmokeResult

    with pytest.raises(IntegrityError, match=why):
        SmokeResult.read(predicate, "attestation x")
