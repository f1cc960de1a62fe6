"""`invoke rehearse --workflow nightly`: nightly.yml under act as its schedule fires, against two
upstream nightlies on the local registry (the pin's 0.26.0 and 0.27.0, a day later), with GitHub's
API (what `gh` asks) answered by the local stand-in."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from ..errors import EnvironmentProblem
from .act import preflight, run_act, wheelhouse
from .act_jobs import Outcome
from .github_stand_in import GitHubStandIn
from .rehearsal_stage import COMMITTER, REPOSITORY, fresh, git, runner_home, stage_release

NIGHTLY_JOBS = ("track", "prune", "bump", "propose", "porting")
GITHUB_PORT = 443  # gh matches a git remote to GH_HOST by host name alone, without a port


def nightly(project: Path, work: Path, log, porting: bool = False) -> Outcome:
    """One rehearsal of nightly.yml as its schedule fires: two upstream nightlies (the pin's 0.26.0
    and 0.27.0, a day later); track mirrors both, prune keeps both (the pin and the newest), bump
    carries and proves 0.27.0, propose pushes nightly/<digest12> to the bare origin and opens a pull
    request with the GitHub stand-in. With
    `porting`, the sparse-mla port is left out of the revision, so 0.27.0 needs porting: propose
    offers the ledger and porting opens one issue."""
    from . import stack

    preflight(GITHUB_PORT)
    work = fresh(work)
    stage = stage_release(project, work, log)
    if porting:
        git("rm", "-rq", "overlays/patches/ports/sparse-mla-prefill-bh64", cwd=stage.repo)
        git("commit", "-qm", "overlays: no port of sparse-mla-prefill-bh64 yet", cwd=stage.repo, env=COMMITTER)
    git("push", "-q", str(stage.origin), "HEAD:refs/heads/main", cwd=stage.repo)
    host, user, password = stage.registry
    upstream, tags = upstream_nightlies(project, stack.up(), log)
    owner, name = REPOSITORY.split("/")
    home = runner_home(work, stage.origin, REPOSITORY)
    variables = {"NIGHTLY_UPSTREAM": upstream, "NIGHTLY_TAGS": "nightly-*", "REGISTRY_HOST": host,
                 "NIGHTLY_MIRROR": f"{host}/rehearsal-{work.name}-{secrets.token_hex(3)}/vllm-openai-rocm-mirror",
                 # prune's: the stage's image repository (no release in it yet), checked with its release key
                 "IMAGE_REPO": stage.image_repo,
                 "BAKERY_RELEASE_PUBLIC_KEY": (stage.keys / "release.pub").read_text()}
    try:
        github = GitHubStandIn(work / "github-tls", owner, name, password, GITHUB_PORT)
    except OSError as e:
        raise EnvironmentProblem(f"the GitHub stand-in cannot listen on 127.0.0.1:{GITHUB_PORT}: {e}") from None
    # gh finds the repository through a remote on GH_HOST: the runner's git knows the stand-in as one
    with (home / ".gitconfig").open("a") as config:
        config.write(f'[remote "github"]\n\turl = https://127.0.0.1/{REPOSITORY}.git\n')
    with github:
        extra = {"GH_HOST": "127.0.0.1", "SSL_CERT_FILE": str(github.ca),
                 # gh 2.23 sends GH_TOKEN only to github.com; for another host it reads this one
                 "GH_ENTERPRISE_TOKEN": password, "GH_PROMPT_DISABLED": "1", "NO_COLOR": "1"}
        jobs, logfile, _ = run_act(stage.repo, stage.repo / ".github" / "workflows" / "nightly.yml", "schedule",
                                {"schedule": "17 5 * * *"}, work, home, wheelhouse(stage.repo, work.parent, log),
                                variables, {"GITHUB_TOKEN": password, "BAKERY_PRUNE_TOKEN": password},
                                ["ubuntu-24.04"], NIGHTLY_JOBS, log, env=extra)
    branches = git("for-each-ref", "--format=%(refname:short)", "refs/heads", cwd=stage.origin).split()
    return Outcome("nightly", jobs, logfile, work, extra={"stage": stage, "github": github.state, "upstream": upstream,
                                                          "tags": tags, "branches": branches, "vars": variables})


def upstream_nightlies(project: Path, registry_host: str, log) -> tuple[str, dict]:
    """An "upstream" repository on the anonymous local registry, as docker.io is: nightly-a is the
    0.26.0 fixture (the pin), nightly-b the 0.27.0 fixture built a day later."""
    from datetime import timedelta

    from ..oci.refs import Descriptor, Reference
    from ..oci.registry import Registry
    from ..release.track.ledger import parse_time
    from . import fixture

    fixtures = project / "tests" / "fixture"
    a = fixture.build(fixtures / "fixture.yaml", registry_host, log=log)
    b = fixture.build(fixtures / "fixture-vllm-0.27.0.yaml", registry_host, log=log)
    reg = Registry(registry_host)
    upstream = Reference.parse(f"{registry_host}/rehearsal-upstream-{secrets.token_hex(3)}/vllm-openai-rocm")
    config = reg.fetch_blob(a.repository, Descriptor.from_json(json.loads(reg.get_manifest(a)[0])["config"]))
    later = parse_time(json.loads(config)["created"]) + timedelta(days=1)
    digests = {"nightly-a": tag_image(reg, a, upstream.with_tag("nightly-a")),
               "nightly-b": tag_image(reg, b, upstream.with_tag("nightly-b"), later.strftime("%Y-%m-%dT%H:%M:%SZ"))}
    return upstream.name, {tag: str(d) for tag, d in digests.items()}


def tag_image(registry, src, dest, created: str | None = None, **config_edits):
    """Tag src's image as dest in the same registry (blobs mounted); with `created` (or other config
    fields), a copy whose config says so (another digest: a nightly built later)."""
    from ..oci import mirror
    from ..oci.refs import Descriptor, Digest

    if created is None and not config_edits:
        return mirror.copy(src, dest, {registry.name: registry}, log=lambda m: None).digest
    body, media_type, _ = registry.get_manifest(src)
    manifest = json.loads(body)
    config = json.loads(registry.fetch_blob(src.repository, Descriptor.from_json(manifest["config"])))
    config.update(config_edits, **({"created": created} if created else {}))
    config_bytes = json.dumps(config).encode()
    config_desc = Descriptor(manifest["config"]["mediaType"], Digest.of(config_bytes), len(config_bytes))
    registry.upload_blob(dest.repository, config_desc, lambda: iter([config_bytes]))
    for layer in manifest["layers"]:
        registry.mount_blob(dest.repository, Digest.parse(layer["digest"]), src.repository)
    manifest["config"] = config_desc.to_json()
    body = json.dumps(manifest).encode()
    registry.put_manifest(dest.repository, str(Digest.of(body)), body, media_type)
    return registry.put_manifest(dest.repository, dest.tag, body, media_type)
