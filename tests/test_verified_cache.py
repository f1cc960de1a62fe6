"""Answers of verifications kept on this machine (BAKERY_CACHE/verified): a release-key signature
check that passed, and documents read by digest. A kept answer is used only for exactly what
decided it; a corrupt or edited entry, another digest or another policy is verified afresh."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from unittest import mock

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from bakery.errors import IntegrityError
from bakery.oci.refs import Descriptor, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry, verified_dir
from bakery.oci.store import RegistryStore
from bakery.trust import attest, keys, policy as policy_mod, sign, verify
from support import ROOT, dev_policy

PIN = "127.0.0.1:5000/verified/base@sha256:" + "0" * 64


class Counting(RegistryStore):
    """A registry store that counts what it is asked."""

    def __init__(self, ref):
        super().__init__(ref)
        self.asked = 0

    def manifest(self, reference):
        self.asked += 1
        return super().manifest(reference)

    def document(self, desc, what):
        self.asked += 1
        return super().document(desc, what)


def pushed(registry: str, repo: str, note: str) -> Reference:
    """A small OCI artifact (a config, no layers) pushed by digest."""
    reg = Registry(registry)
    config = json.dumps({"note": note}).encode()
    desc = Descriptor.of("application/vnd.bakery.test.config.v1+json", config)
    reg.upload_blob(repo, desc, lambda: iter([config]))
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": desc.to_json(),
                           "layers": []}, sort_keys=True).encode()
    return Reference(registry, repo, None, reg.put_manifest(repo, note, manifest, OCI_MANIFEST))


@pytest.fixture
def signed(registry, tmp_path, monkeypatch):
    """An artifact signed by key a, another left unsigned, and a policy per key (BAKERY_CACHE empty)."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    repo = f"verified/{uuid.uuid4().hex[:12]}"
    good, unsigned = pushed(registry, repo, "signed"), pushed(registry, repo, "unsigned")
    private = {name: ec.generate_private_key(ec.SECP256R1()) for name in ("a", "b")}
    policies = {}
    for name, key in private.items():
        (tmp_path / f"{name}.pub").write_bytes(keys.public_pem(key.public_key()))
        policies[name] = policy_mod.load_policy(dev_policy(tmp_path / f"{name}.yaml", PIN), ROOT,
                                                {"release": [tmp_path / f"{name}.pub"]})
    attest.sign_image(RegistryStore(good), good, sign.Signer(private["a"]))
    return good, unsigned, policies


def entry(ref: Reference, policy) -> Path:
    return verify._signed_entry(ref, policy.roles["release"], policy)[0]


def test_an_accepted_signature_is_kept_and_answers_without_the_registry(signed):
    good, _, policies = signed
    first = Counting(good)
    verify.require_signed(first, good, policies["a"], "kernel artifact")
    assert first.asked >= 2  # the .sig manifest and its payload
    assert entry(good, policies["a"]).is_file()
    again = Counting(good)
    verify.require_signed(again, good, policies["a"], "kernel artifact")
    assert again.asked == 0


def test_a_kept_answer_is_not_taken_for_another_digest_or_key(signed):
    good, unsigned, policies = signed
    verify.require_signed(Counting(good), good, policies["a"], "kernel artifact")
    kept = entry(good, policies["a"])
    # the unsigned artifact, with the signed one's entry copied to where its own would be
    forged = entry(unsigned, policies["a"])
    forged.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(kept, forged)
    store = Counting(unsigned)
    with pytest.raises(IntegrityError, match="is signed by 0 of 1 required release key"):
        verify.require_signed(store, unsigned, policies["a"], "kernel artifact")
    assert store.asked >= 1  # verified, not answered from the copied entry
    # another policy (key b only): the signature by a does not count, whatever is kept for key a
    store = Counting(good)
    with pytest.raises(IntegrityError, match="not signed by a release key of the policy"):
        verify.require_signed(store, good, policies["b"], "kernel artifact")
    assert store.asked >= 1
    assert not entry(good, policies["b"]).exists()  # a refusal is never kept


@pytest.mark.parametrize("damage", ["garbled", "signers edited", "digest edited", "empty"])
def test_a_corrupt_or_edited_entry_is_ignored_and_the_signature_verified_again(signed, damage):
    good, _, policies = signed
    verify.require_signed(Counting(good), good, policies["a"], "kernel artifact")
    kept = entry(good, policies["a"])
    doc = json.loads(kept.read_text())
    if damage == "garbled":
        kept.write_text(kept.read_text()[:-7])
    elif damage == "signers edited":
        doc["signed_by"] = doc["signed_by"] + ["f" * 64]
        kept.write_text(json.dumps(doc))
    elif damage == "digest edited":
        doc["decided_by"]["digest"] = "sha256:" + "1" * 64
        kept.write_text(json.dumps(doc))
    else:
        kept.write_text("")
    store = Counting(good)
    verify.require_signed(store, good, policies["a"], "kernel artifact")
    assert store.asked >= 2  # asked the registry again, and accepted what it verified
    decided_by = verify._signed_entry(good, policies["a"].roles["release"], policies["a"])[1]
    assert verify._remembered_signers(kept, decided_by) == set(decided_by["keys"])  # kept whole again


def test_a_document_kept_by_digest_is_checked_again_when_read(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    ref = pushed(registry, f"verified/{uuid.uuid4().hex[:12]}", "doc")
    reg = Registry(registry)
    body, media_type, digest = reg.get_manifest(ref, cached=True)
    assert (body, media_type, digest) == reg.get_manifest(ref) and digest == ref.digest
    kept = list((verified_dir() / "manifests").iterdir())
    assert len(kept) == 1
    kept[0].write_bytes(body.replace(b"schemaVersion", b"schemaVersioN"))  # no longer the digest's bytes
    sent = []
    original = reg.transport.request

    def counted(method, path, **kw):
        sent.append((method, path))
        return original(method, path, **kw)

    with mock.patch.object(reg.transport, "request", counted):
        assert reg.get_manifest(ref, cached=True) == (body, media_type, digest)
    assert sent == [("GET", f"/v2/{ref.repository}/manifests/{ref.digest}")]  # fetched again, verified
    assert kept[0].read_bytes() == body  # and kept again
    sent.clear()
    assert reg.get_manifest(ref, cached=True) == (body, media_type, digest) and sent == []
    config = Descriptor.from_json(json.loads(body)["config"])
    assert reg.fetch_document(ref.repository, config, "config", cached=True) == \
        reg.fetch_document(ref.repository, config, "config")
    assert len(list((verified_dir() / "documents").iterdir())) == 1
