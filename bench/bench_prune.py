"""`invoke prune` on a simulated month (issue 52): its time and registry requests on about a thousand
manifests, and the bytes docker-registry 2.8's own garbage-collect frees after it.

    .venv/bin/python bench/bench_prune.py                 # 30 nightlies, 3 candidates a day, 2 promoted
    .venv/bin/python bench/bench_prune.py --nightlies 10  # smaller

The month (bakery/dev/month.py) is written by bakery's own attest code into a registry of its own
(127.0.0.1:5016, deletes on, no blob descriptor cache). The same month is written twice, in two
repository pairs: prune --apply runs on one; on the other, the deletions prune planned are made with
`skopeo delete`, one process per manifest, as a script around a standard tool would make them, in
the same order. That is the ratio: prune's whole run (listing, verifying each release's provenance,
planning, deleting) against only the deletes of the scripted way. Bytes are measured on the registry's
disk before prune and after `registry garbage-collect`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PORT = 5016


def main() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    from bakery.cli import release as cmd
    from bakery.dev import month as month_mod, stack
    from bakery.trust import keys, sign

    ap = argparse.ArgumentParser()
    ap.add_argument("--nightlies", type=int, default=30)
    ap.add_argument("--candidates", type=int, default=3, help="candidates a day")
    ap.add_argument("--promoted", type=int, default=2)
    ap.add_argument("--layer-kib", type=int, default=4096, help="a nightly's own layer; a candidate's is a quarter")
    args = ap.parse_args()
    host = stack.ensure_registry(PORT, name="registry-bench-prune", collected=True)
    data = stack.registry_dir(PORT, "registry-bench-prune") / "data"
    work = Path(tempfile.mkdtemp(prefix="bench-prune-"))
    key = ec.generate_private_key(ec.SECP256R1())
    (work / "release.pub").write_bytes(keys.public_pem(key.public_key()))
    signer = sign.Signer(key)
    (work / "retention.yaml").write_text("candidates: 3\nnightlies: 14\n")
    (work / "policy.yaml").write_text("roles: {release: {keys: [], threshold: 1}, smoke: {keys: [], threshold: 1}, "
                                      "rebuilder: {keys: [], threshold: 1}}\nallowed_sources: ['*']\n"
                                      "allowed_builders: [local]\nallowed_repositories: ['127.0.0.1:*/*']\n"
                                      "allow_dirty: true\nbase: example.invalid/base@sha256:" + "0" * 64 + "\n")
    runs = {}
    for side in ("prune", "skopeo"):
        git = work / side
        (git / "provenance").mkdir(parents=True)
        (git / "provenance" / "smoke.yaml").write_bytes((ROOT / "provenance" / "smoke.yaml").read_bytes())
        subprocess.run(["git", "init", "-q", str(git)], check=True)
        run = f"bench-{secrets.token_hex(3)}"
        t = time.monotonic()
        month = month_mod.simulate(host, f"{run}/app", f"{run}/mirror", git, signer, args.nightlies, args.candidates,
                                   args.promoted, args.layer_kib * 1024)
        print(f"{side}: the month written in {time.monotonic() - t:.0f} s ({run})", flush=True)
        (git / "nightlies.yaml").write_text(month_mod.ledger_text(month, host, "upstream.invalid/vllm", f"{run}/mirror"))
        runs[side] = (git, run, month)

    def prune(side: str, apply: bool, trace: Path | None = None):
        git, run, _ = runs[side]
        if trace:
            os.environ["BAKERY_CRASH_TRACE"] = str(trace)
        try:
            t = time.monotonic()
            done = cmd.prune(git, f"{host}/{run}/app", str(work / "release.pub"), str(work / "policy.yaml"),
                             str(work / "retention.yaml"), str(git / "nightlies.yaml"), apply)
            return done, time.monotonic() - t
        finally:
            os.environ.pop("BAKERY_CRASH_TRACE", None)

    planned, _ = prune("skopeo", False)
    gone = [d.stored for d in planned.decisions if not d.keep]
    t = time.monotonic()
    for s in gone:
        subprocess.run(["skopeo", "delete", "--tls-verify=false", f"docker://{host}/{s.repo}@{s.digest}"], check=True,
                       capture_output=True)
    scripted = time.monotonic() - t
    stack.garbage_collect(PORT, "registry-bench-prune")  # the scripted side's garbage gone before measuring
    before = disk(data)
    dry, dry_s = prune("prune", False, work / "dry.trace")
    applied, apply_s = prune("prune", True, work / "apply.trace")
    t = time.monotonic()
    stack.garbage_collect(PORT, "registry-bench-prune")
    gc_s = time.monotonic() - t
    after = disk(data)
    requests = {name: len((work / f"{name}.trace").read_text().splitlines()) for name in ("dry", "apply")}
    kept = sum(1 for d in dry.decisions if d.keep)
    print(f"\nmanifests: {len(dry.decisions)} ({kept} kept, {len(dry.decisions) - kept} deleted); the skopeo side "
          f"had {len(gone)} to delete")
    print(f"prune, dry run: {dry_s:.1f} s, {requests['dry']} requests")
    print(f"prune --apply: {apply_s:.1f} s, {requests['apply']} requests (its own listing and plan included)")
    print(f"skopeo delete, the same deletions, one process each: {scripted:.1f} s; prune --apply / skopeo: "
          f"x{apply_s / scripted:.2f}")
    print(f"registry garbage-collect: {gc_s:.1f} s")
    print(f"on disk: {before / 2**20:.1f} MiB before prune, {after / 2**20:.1f} MiB after it and garbage-collect: "
          f"{(before - after) / 2**20:.1f} MiB freed; prune said up to {dry.reclaimable / 2**20:.1f} MiB")


def disk(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


if __name__ == "__main__":
    main()
