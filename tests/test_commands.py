"""The decisions the tasks used to make in their bodies, now in bakery/cli/, tested without a
subprocess, an engine or a registry: which role may attach which statement, a hardware-only proof,
what a deploy refuses before it asks anyone anything, and the lines the tasks print."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from bakery.cli import deploy, proofs, release, render
from bakery.errors import InputError, NotProven
from bakery.inputs.proof_spec import ProofSpec
from bakery.proofs.runner import BROKEN, FIXED, Verdict
from bakery.release.rebase import ProofRow

ROOT = Path(__file__).resolve().parent.parent
PIN = "127.0.0.1:5000/ours/image@sha256:" + "a" * 64
PROXY = "127.0.0.1:5000/caddy@sha256:" + "b" * 64

# who signs which in-toto predicate, as docs/security.md states it (not read from the code)
SIGNERS = [("https://slsa.dev/provenance/v1", "release"), ("https://spdx.dev/Document", "release"),
           ("https://openvex.dev/ns", "release"), ("https://in-toto.io/attestation/test-result/v0.1", "smoke")]


@pytest.mark.parametrize("kind,signer", SIGNERS)
def test_only_the_role_that_signs_a_statement_type_may_attach_it(kind, signer):
    release.may_attach(kind, signer, "e.json")
    for role in {"release", "smoke", "rebuilder"} - {signer}:
        with pytest.raises(InputError, match=f"which the {role} role does not sign: not attached"):
            release.may_attach(kind, role, "e.json")


def test_an_unknown_statement_type_is_attached_by_no_role():
    with pytest.raises(InputError, match="type https://example.com/mine"):
        release.may_attach("https://example.com/mine", "smoke", "e.json")


def overlay(proof, baked=True, oid="fence"):
    return SimpleNamespace(id=oid, proof=proof, baked=baked)


def test_a_proof_marked_hardware_is_shown_hardware_only_and_counts_as_proven():
    row = ProofRow(overlay(ProofSpec(None, (), "needs the MI300X's FNUZ units")), Verdict("CANNOT-PROVE", "x"), None)
    shown = proofs.hardware_only(row)
    assert shown.stock.verdict == "hardware-only" and shown.overlay is row.overlay
    proofs.Proven((shown,)).check()  # no error: a reason is a verdict of its own


def test_a_scripted_proof_is_shown_as_it_ran_and_must_be_broken_then_fixed(tmp_path):
    script = tmp_path / "fence.py"
    script.write_text("")
    good = ProofRow(overlay(ProofSpec(script)), Verdict(BROKEN, "races"), Verdict(FIXED, "holds"))
    assert proofs.hardware_only(good) is good
    proofs.Proven((good,)).check()
    bad = ProofRow(overlay(ProofSpec(script), oid="gumbel"), Verdict(FIXED, "no bug here"), Verdict(FIXED, "holds"))
    with pytest.raises(NotProven, match="FIXED overlaid\\): gumbel$"):
        proofs.Proven((good, bad)).check()


def test_the_prove_table_names_a_hardware_only_row_and_its_reason(tmp_path):
    script = tmp_path / "fence.py"
    script.write_text("")
    rows = (ProofRow(overlay(ProofSpec(script)), Verdict(BROKEN, "races", 1.25), Verdict(FIXED, "holds", 0.5)),
            proofs.hardware_only(ProofRow(overlay(ProofSpec(None, (), "only an MI300X can tell"), oid="fnuz"),
                                          Verdict("CANNOT-PROVE", ""), None)))
    assert render.proven(proofs.Proven(rows, "cpu")).splitlines() == [
        "overlay  stock         overlaid      check          seconds  detail",
        "fence  BROKEN        FIXED         fence.py (cpu)     1.8  holds",  # ids set the width, as before
        "fnuz   hardware-only hardware-only hardware           0.0  only an MI300X can tell"]


def test_a_kit_that_is_not_fixed_is_not_proven():
    kit = proofs.Proven(kit=Verdict(BROKEN, "still races"))
    assert render.proven(kit) == "ours.py: BROKEN (still races)"
    with pytest.raises(NotProven, match="ours.py is not proven FIXED"):
        kit.check()


@pytest.mark.parametrize("change,message", [
    ({"compose": None, "k8s": None}, "say where: --compose DIR"),
    ({"k8s": "k8s"}, "say where: --compose DIR"),
    ({"snapshot": None}, "--snapshot DIR"),
    ({"image": "127.0.0.1:5000/ours/image:latest"}, "--image"),
    ({"proxy_image": "caddy:2"}, "--proxy-image"),
    ({"hostname": "bad host name"}, "hostname"),
])
def test_a_deploy_refuses_bad_input_before_it_asks_a_registry_anything(tmp_path, change, message):
    """plan() runs before verify: every refusal here happens with no registry listening at all."""
    given = {"image": PIN, "proxy_image": PROXY, "hostname": "api.example.com", "allow": ["10.0.0.0/8"],
             "email": "ops@example.com", "compose": str(tmp_path / "run"), "snapshot": "/models/dsv4", **change}
    with pytest.raises(InputError, match=message):
        deploy.plan(ROOT, **given)
    assert not (tmp_path / "run").exists()


def test_a_deploy_plan_pins_both_images_and_renders_the_proxy_first(tmp_path):
    plan = deploy.plan(ROOT, PIN, PROXY, "api.example.com", ["10.0.0.0/8"], "ops@example.com",
                       compose=str(tmp_path / "run"), snapshot="/models/dsv4")
    assert (plan.image, plan.proxy, plan.compose, plan.k8s) == (PIN, PROXY, tmp_path / "run", None)
    assert b"api.example.com" in plan.caddyfile and plan.compose_file == ROOT / "image" / "compose.yaml"


def test_the_disk_line_names_a_signed_artifact_by_a_short_tag():
    assert render.disk(SimpleNamespace(cached=("reg/kernels", "kernels-" + "c" * 64))) == \
        "ok: reg/kernels:kernels-cccccccccccc... holds the kernels, signed by a release key; nothing will be " \
        "compiled, no toolchain file taken out"
    assert render.disk(SimpleNamespace(cached=None, toolchain="b@sha256:1", needed=3 << 30, how="exact", free=10 << 30,
                                       where=Path("/mnt/bakery/cache/toolchains"))) == \
        "ok: the toolchain's files of b@sha256:1 take 3.0 GiB (exact) at /mnt/bakery/cache/toolchains; 10.0 GiB free there"
