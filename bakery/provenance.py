"""SLSA v1 provenance (an in-toto Statement v1) from the build record, and provenance/policy.yaml."""

from __future__ import annotations

import json
from pathlib import Path

from . import inputs
from .errors import InputError
from .refs import Reference

STATEMENT = "https://in-toto.io/Statement/v1"
SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/dsv4-mi300x/bakery/build/v1"
POLICY_KEYS = {"allowed_sources": list, "base": str, "require_smoke": bool}


def statement(subject: Reference, predicate_type: str, predicate: dict) -> bytes:
    """An in-toto Statement v1 about one image digest, serialized deterministically."""
    body = {"_type": STATEMENT, "subject": [{"name": subject.name, "digest": {"sha256": subject.digest.hex}}],
            "predicateType": predicate_type, "predicate": predicate}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def predicate(record: dict) -> dict:
    """The SLSA v1 predicate: what was built from what, by whom; nothing recomputed."""
    src, base = record["source"], record["base"]
    deps = [{"uri": f"docker://{base['pinned']}", "digest": {"sha256": base["pinned"].split("sha256:")[1]},
             "name": "base image"},
            {"uri": f"git+{src['repository']}@{src['revision']}", "digest": {"gitCommit": src["revision"]},
             "name": "source"}]
    if base["manifest"]["digest"] not in base["pinned"]:  # the pin named an index: add the platform image
        deps.insert(1, {"uri": f"docker://{base['name']}@{base['manifest']['digest']}",
                        "digest": {"sha256": base["manifest"]["digest"].split(":")[1]},
                        "name": f"base image ({base['platform']})"})
    deps += [{"name": i["path"], "digest": {"sha256": i["sha256"]}} for i in record["inputs"]]
    for artifact in record.get("artifacts", []):
        deps += [{"name": s["path"], "digest": {"sha256": s["sha256"]}} for s in artifact["sources"]
                 if not any(d.get("name") == s["path"] for d in deps)]
    byproducts = [{"name": a["path"], "digest": {"sha256": a["sha256"]},
                   "annotations": {"arch": a["arch"], "toolchain": a["toolchain"]}} for a in record.get("artifacts", [])]
    byproducts += [{"name": f"layer: {l['comment']}", "digest": {"sha256": l["digest"].split(":")[1]},
                    "mediaType": l["mediaType"]} for l in record["layers"]]
    # each baked overlay's proof: the code that judged it, and what it said on stock and overlaid bytes
    byproducts += [{"name": f"proof: {o['id']}", "digest": {"sha256": o["proof"]["code_sha256"]},
                    "annotations": {"stock": o["proof"]["stock"], "overlaid": o["proof"]["overlaid"],
                                    "script": o["proof"]["script"], "reason": o["proof"]["reason"]}}
                   for o in record["overlays"] if o["baked"] and (o.get("proof") or {}).get("code_sha256")]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "base": base["pinned"],
                "platform": base["platform"],
                "source": {"repository": src["repository"], "revision": src["revision"], "dirty": src["dirty"]},
                "overlaysLock": {"sha256": record["overlays_lock"]["sha256"], "base": record["overlays_lock"]["base"]},
                "sourceDateEpoch": src["source_date_epoch"],
            },
            "internalParameters": {"tools": record["tools"]},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": record["builder"]["id"]},
            "metadata": {"invocationId": record["builder"]["invocation"], "startedOn": record["started"],
                         "finishedOn": record["finished"]},
            "byproducts": byproducts,
        },
    }


def load_policy(path: Path, project: Path) -> dict:
    """The verification policy; its base defaults to the pin in image/base.yaml."""
    from .base import load_spec

    policy = inputs.load_yaml(path, POLICY_KEYS, required={"allowed_sources"})
    if not policy["allowed_sources"]:
        raise InputError(f"{path}: allowed_sources is empty: list the repositories whose builds you trust")
    base = policy.get("base")
    policy["base"] = str(Reference.parse_pinned(base, f"{path}: base") if base
                         else load_spec(project / "image" / "base.yaml").image)
    policy.setdefault("require_smoke", False)
    return policy
