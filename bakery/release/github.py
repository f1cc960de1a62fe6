"""GitHub's REST API, for two questions no workflow file can answer: is this repository set up for a
release (`invoke preflight`, before the first tag), and has an MI300X runner taken the smoke job
(`invoke await-runner`, in the release itself)?

Nothing here holds a key or runs code of a base. The API is GITHUB_API_URL (GitHub's own by
default; the tests point it at bakery/dev/github_stand_in.py, the only GitHub there is here), the
token GITHUB_TOKEN (or GH_TOKEN). What a repository says is data: quoted inert where it is shown.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .. import untrusted
from ..errors import AuthError, EnvironmentProblem, InputError, RegistryError
from ..oci.refs import Digest
from .settings import Settings

API = "https://api.github.com"
NOT_READY = 12  # preflight's exit code: something a release needs is missing
MAX_PAGES = 100  # a listing's pages read at most (10,000 items at 100 a page): one that goes on is refused


class GitHub:
    """GET and POST against GITHUB_API_URL with a token; JSON answers, a 404 as None."""

    def __init__(self, token: str | None = None, api: str | None = None, timeout: float = 30):
        import requests

        self.api = (api or os.environ.get("GITHUB_API_URL") or API).rstrip("/")
        self.token = token or os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
        if not self.token:
            raise InputError("no GitHub token: set GITHUB_TOKEN (or GH_TOKEN) to a token that may read the repository's "
                             "settings (a fine-grained token with Administration, Environments, Secrets and Variables: "
                             "read)")
        self.session, self.timeout = requests.Session(), timeout
        self.session.headers.update({"Authorization": f"Bearer {self.token}", "Accept": "application/vnd.github+json",
                                     "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "bakery"})

    def _call(self, method: str, path: str, url: str | None = None, **kwargs):
        import requests

        try:
            resp = self.session.request(method, url or self.api + path, timeout=self.timeout, **kwargs)
        except requests.RequestException as e:
            raise RegistryError(f"GitHub's API at {self.api} did not answer {method} {path}: {type(e).__name__}") \
                from None
        if resp.status_code in (401, 403):
            what = "delete it (a package version: the token needs admin on the package)" if method == "DELETE" \
                else "read it"
            raise AuthError(f"GitHub refused {method} {path} ({resp.status_code}): the token may not {what}")
        return resp

    def get(self, path: str):
        resp = self._call("GET", path)
        if resp.status_code == 404:
            return None
        return self._json(resp, path)

    def listing(self, path: str, key: str | None = None) -> list:
        """Every item of a listing, each page's Link rel="next" followed to the last (GitHub gives
        at most per_page, 100, a page): the list under `key` of each page (None: the page is the
        list); [] for a 404."""
        items: list = []
        url: str | None = self.api + path
        for _ in range(MAX_PAGES):
            resp = self._call("GET", path, url=url)
            if resp.status_code == 404 and not items:
                return []
            found = self._json(resp, path)
            page = found.get(key) if key is not None and isinstance(found, dict) else found
            if not isinstance(page, list):
                raise RegistryError(f"GitHub's answer to GET {path} is not a listing" + (f" of {key}" if key else ""))
            items += page
            url = self._next_page(resp.headers.get("Link"), path)
            if url is None:
                return items
        raise RegistryError(f"GitHub's listing GET {path} goes on past {MAX_PAGES} pages: refused")

    def _next_page(self, link: str | None, path: str) -> str | None:
        found = re.search(r'<([^>]*)>\s*;\s*rel="?next"?', link or "")
        if found is None:
            return None
        if not found.group(1).startswith(self.api + "/"):  # the token goes with it: never off the API
            raise RegistryError(f"GitHub's answer to GET {path} links its next page to "
                                f"{untrusted.safe(found.group(1), limit=120)!r}, outside {self.api}: refused")
        return found.group(1)

    def _json(self, resp, path: str):
        if resp.status_code != 200:
            raise RegistryError(f"GitHub answered GET {path} with {resp.status_code}")
        try:
            return resp.json()
        except ValueError:
            raise RegistryError(f"GitHub's answer to GET {path} is not JSON") from None

    def post(self, path: str, body: dict | None = None) -> int:
        return self._call("POST", path, json=body or {}).status_code

    def delete(self, path: str) -> tuple[int, str]:
        """(status, GitHub's message where it gave one) of DELETE path."""
        resp = self._call("DELETE", path)
        try:
            message = str(resp.json().get("message", "")) if resp.content else ""
        except (ValueError, AttributeError):
            message = ""
        return resp.status_code, message


# -- GHCR's deletes: package versions ------------------------------------------------------------------

class PackageVersions:
    """A GHCR repository's manifests as GitHub lists them, package versions (one per manifest digest,
    tagged or not), deleted through the REST API: GHCR answers no registry DELETE. The repository
    OWNER/NAME... is the container package NAME... (nested names are one package) of OWNER, an
    organization or a user. Used by `invoke prune` in place of a Registry's delete_manifest."""

    def __init__(self, gh: GitHub, registry_name: str, repo: str):
        import urllib.parse

        owner, _, package = repo.partition("/")
        if not package:
            raise InputError(f"{registry_name}/{repo}: a GHCR repository is OWNER/PACKAGE")
        self.gh, self.name = gh, registry_name
        quoted = urllib.parse.quote(package, safe="")
        self.base = next((path for scope in ("orgs", "users")
                          if gh.get(path := f"/{scope}/{owner}/packages/container/{quoted}") is not None), None)
        if self.base is None:
            raise RegistryError(f"GitHub's API at {gh.api} knows no container package {package!r} of {owner!r}: "
                                f"{registry_name}/{repo} is not a GHCR package this token can see")
        self._versions: dict[Digest, tuple[int, tuple[str, ...]]] | None = None

    def versions(self) -> dict[Digest, tuple[int, tuple[str, ...]]]:
        """{manifest digest: (version id, its tags)}, every page read once."""
        if self._versions is None:
            found: dict[Digest, tuple[int, tuple[str, ...]]] = {}
            for item in self.gh.listing(f"{self.base}/versions?per_page=100"):
                try:
                    digest = Digest.parse(item["name"])
                    tags = item.get("metadata", {}).get("container", {}).get("tags", [])
                    if type(item["id"]) is not int or not all(isinstance(t, str) for t in tags):
                        raise TypeError  # an id that is a bool, or a tag that is no string
                except (KeyError, TypeError, AttributeError, InputError):
                    raise RegistryError(f"GitHub's versions of {self.base} hold one that is not a container "
                                        f"version: {untrusted.safe(repr(item), limit=120)}") from None
                if digest in found or item["id"] in {i for i, _ in found.values()}:
                    raise RegistryError(f"GitHub lists {digest} or its version id {item['id']} twice among the "
                                        f"versions of {self.base}: refused")
                found[digest] = (item["id"], tuple(sorted(tags)))
            self._versions = found
        return self._versions

    def delete_manifest(self, repo: str, digest: Digest) -> bool:
        """Delete the version that is REPO@digest; False where GitHub has it gone already."""
        from .. import crashpoint

        version = self.versions().get(digest)
        if version is None:
            raise RegistryError(f"{self.name}/{repo}@{digest} is no version of {self.base} on GitHub: the registry "
                                f"and GitHub's API disagree; stopped")
        # read again now: still this digest, with the tags planned (a promote since would lose its tag)
        now = self.gh.get(f"{self.base}/versions/{version[0]}")
        if now is None:
            return False
        now = now if isinstance(now, dict) else {}
        tags = ((now.get("metadata") or {}).get("container") or {}).get("tags")
        if now.get("name") != str(digest) or not isinstance(tags, list) or tuple(sorted(map(str, tags))) != version[1]:
            raise RegistryError(f"{self.name}/{repo}@{digest}: GitHub's version {version[0]} is now "
                                f"{untrusted.safe(str(now.get('name')), limit=80)} tagged "
                                f"{untrusted.safe(repr(tags), limit=120)}, not what prune planned: stopped")
        status, message = self.gh.delete(f"{self.base}/versions/{version[0]}")
        crashpoint.reached(f"DELETE {self.base}/versions/{version[0]} -> {status}")
        if status == 404:
            return False
        if status != 204:
            raise RegistryError(f"GitHub refused to delete {self.name}/{repo}@{digest} (version {version[0]}, HTTP "
                                f"{status}): {untrusted.safe(message, limit=160) or 'no reason given'}")
        return True


# -- the release's watch on the MI300X runner ---------------------------------------------------------

STARTED = ("in_progress", "completed")
FOR_REVIEW = ("waiting",)  # an environment's reviewers have not approved it yet: no runner is asked for


def await_runner(gh: GitHub, repository: str, run_id: str, job: str, minutes: float, log=print,
                 poll: float = 30, review_minutes: float = 60, clock=time.monotonic, sleep=time.sleep) -> str:
    """Wait until the job named `job` of this run has started on a runner: its status, once it has.
    Queued (approved, waiting for a runner) past `minutes`: the run is cancelled and
    EnvironmentProblem says why. Still awaiting its environment's reviewers after `review_minutes`:
    not watched further (no runner is asked for until then)."""
    path = f"/repos/{repository}/actions/runs/{run_id}/jobs?per_page=100"
    queued_since = None
    started = clock()
    while True:
        found = gh.get(path)
        jobs = found["jobs"] if isinstance(found, dict) and isinstance(found.get("jobs"), list) else []
        # a called workflow's job is listed as "CALLER / NAME"
        status = next((str(j.get("status")) for j in jobs if isinstance(j, dict) and
                       str(j.get("name")).rsplit(" / ", 1)[-1] == job), None)
        if status in STARTED:
            log(f"{job}: {status}: a runner took it")
            return status
        now = clock()
        if status in FOR_REVIEW or status is None:  # awaiting review, or not yet made (its needs still running)
            queued_since = None
            if now - started > review_minutes * 60:
                log(f"{job}: still {status or 'not queued'} after {review_minutes:.0f} minutes: not watched further")
                return status or "not queued"
        else:
            queued_since = now if queued_since is None else queued_since
            if now - queued_since > minutes * 60:
                gh.post(f"/repos/{repository}/actions/runs/{run_id}/cancel")
                raise EnvironmentProblem(
                    f"no runner took {job!r} within {minutes:g} minutes of its being queued: no online runner has its "
                    f"labels (self-hosted, linux, x64, mi300x) for this repository; the run is cancelled. Register the "
                    f"MI300X runner (docs/release.md, GitHub set-up: an ephemeral runner in a group limited to this repository's "
                    f"release.yml on v* tags), then run the workflow again")
        sleep(poll)


# -- preflight ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gap:
    """Something a release still lacks, and what to do about it."""
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}"


def repository_gaps(project: Path, settings: Settings) -> list[Gap]:
    """What the checkout itself lacks: a lock made for the pin, a mirror for the base."""
    from ..base import spec as base_mod
    from ..inputs import overlays as overlays_mod
    from ..project import Project

    gaps = []
    proj = Project(project)
    spec = base_mod.load_spec(proj.base_yaml)
    lock = overlays_mod.read_lock(proj.lock)
    from ..oci.refs import Reference

    try:
        locked = Reference.parse(lock.base).digest
    except InputError:
        locked = None
    if locked != spec.image.digest:
        gaps.append(Gap(f"overlays/overlays.lock was made for {untrusted.safe(lock.base, limit=120)}, not the pinned "
                        f"base {spec.image} (a fixture's lock, until the real base is locked)",
                        f"run `invoke rebase --base {spec.image}` on a machine that can pull it, review, commit"))
    if spec.mirror is None:
        gaps.append(Gap("image/base.yaml names no mirror (upstream keeps only its last 14 nightly tags)",
                        "run `invoke mirror --to ghcr.io/ORG/vllm-openai-rocm` and set mirror: in image/base.yaml"))
    return gaps


def github_gaps(gh: GitHub, repository: str, settings: Settings) -> list[Gap]:
    """What GitHub's settings for the repository lack, against .github/release-settings.yaml."""
    gaps = []
    base = f"/repos/{repository}"
    repo_secrets = _names(gh.listing(f"{base}/actions/secrets?per_page=100", "secrets"))
    repo_secrets |= _names(gh.listing(f"{base}/actions/organization-secrets?per_page=100", "secrets"))
    for name, role in sorted(settings.variables.items()):
        found = gh.get(f"{base}/actions/variables/{name}")
        value = (found or {}).get("value") if isinstance(found, dict) else None
        if not value:
            gaps.append(Gap(f"repository variable {name} is missing or empty",
                            f"set it to {role}.pub (`invoke keygen --role {role}`) in Settings -> Secrets and "
                            f"variables -> Actions -> Variables (a repository variable: jobs without an environment "
                            f"verify with it)"))
        elif not _public_key(value):
            gaps.append(Gap(f"repository variable {name} is not a PEM public key (ECDSA P-256)",
                            f"set it to the whole {role}.pub, BEGIN and END lines included"))
    for env in settings.environments.values():
        path = f"{base}/environments/{env.name}"
        found = gh.get(path)
        # who may deploy: tags through reviewers, or (a scheduled job's) one branch with nobody to ask
        allowed, rule = (("branch", env.branch), f"a branch rule {env.branch}") if env.branch else \
            (("tag", settings.tags), f"a tag rule {settings.tags}")
        limited = f"branch {env.branch}" if env.branch else f"tags {settings.tags}"
        if found is None:
            gaps.append(Gap(f"environment {env.name} does not exist",
                            f"create it (Settings -> Environments) with its secrets {', '.join(env.secrets)}, "
                            + ("" if env.branch else "required reviewers, ") + f"and deployments limited to {limited}"))
            continue
        rules = found.get("protection_rules") or []
        reviewers = [r for r in rules if isinstance(r, dict) and r.get("type") == "required_reviewers"]
        unattended = env.branch is not None  # a schedule's job: a reviewer would hold every night's run
        if not unattended and (not reviewers or not any(r.get("reviewers") for r in reviewers)):
            gaps.append(Gap(f"environment {env.name} has no required reviewers",
                            "add one or more (Settings -> Environments -> Required reviewers)"))
        elif not unattended and not any(r.get("prevent_self_review") for r in reviewers):
            gaps.append(Gap(f"environment {env.name} lets whoever started the run approve it",
                            "tick 'Prevent self-review' under its required reviewers"))
        policy = found.get("deployment_branch_policy") or {}
        policies = [p for p in gh.listing(f"{path}/deployment-branch-policies?per_page=100", "branch_policies")
                    if isinstance(p, dict)] if policy.get("custom_branch_policies") else []
        # each rule lets its refs deploy: one more (another branch or tag rule, a `*`) opens the environment to them
        more = [p for p in policies if ((p.get("type") or "branch"), p.get("name")) != allowed]
        if len(more) == len(policies):
            gaps.append(Gap(f"environment {env.name} is not limited to {limited}",
                            f"set its deployment branches and tags to 'Selected', with {rule} (and no other rule)"))
        elif more:
            rules = ", ".join(f"{untrusted.safe(p.get('type') or 'branch', limit=10)} rule "
                              f"{untrusted.safe(p.get('name'), limit=60)!r}" for p in more)
            gaps.append(Gap(f"environment {env.name} is not limited to {limited} (its {rules} also "
                            f"let those refs deploy)",
                            f"delete them (Settings -> Environments -> {env.name} -> Deployment branches and tags), "
                            f"keeping only {rule}"))
        held = _names(gh.listing(f"{path}/secrets?per_page=100", "secrets"))
        for secret in env.secrets:
            if secret not in held:
                gaps.append(Gap(f"environment {env.name} lacks its secret {secret}",
                                "add it there (not as a repository secret)"))
        vars_held = _names(gh.listing(f"{path}/variables?per_page=100", "variables"))
        for variable in env.variables:
            if variable not in vars_held:
                gaps.append(Gap(f"environment {env.name} lacks its variable {variable}", "add it there"))
        for secret in env.secrets:
            if secret in repo_secrets:
                gaps.append(Gap(f"{secret} is also a repository (or organization) secret, which any workflow on "
                                f"any branch can read",
                                f"delete that secret; keep it in environment {env.name} only"))
    gaps += _ruleset_gaps(gh, base, settings)
    gaps += _runner_gaps(gh, repository, settings)
    gaps += _package_gaps(gh, repository, settings)
    return gaps


def _names(items: list) -> set:
    return {i.get("name") for i in items if isinstance(i, dict)}


def _public_key(pem: str) -> bool:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_public_key(pem.strip().encode() + b"\n")
    except ValueError:
        return False
    return isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"


# who may bypass the tag ruleset: maintainers only, as GitHub names them (RepositoryRole 2 is the
# Maintain role and 5 Admin; 4 is Write, anyone with push rights). A team's or an app's members, a
# deploy key's holder or a custom role's grants cannot be read with this token: each counts as open.
MAINTAINER_ROLES = (2, 5)
OWNERS = ("OrganizationAdmin", "EnterpriseOwner")  # they may change the ruleset itself anyway


def _ruleset_gaps(gh: GitHub, base: str, settings: Settings) -> list[Gap]:
    """The v* tags, and each branch a `branch:` environment deploys from (its secrets are guarded by
    who may put commits there: no reviewer asks), each protected by an enforced ruleset."""
    gaps = _protected(gh, base, "tag", f"refs/tags/{settings.tags}", f"{settings.tags} tags",
                      {"creation", "update", "deletion"}, "restricting creations, updates and deletions")
    for branch in sorted({e.branch for e in settings.environments.values() if e.branch}):
        gaps += _protected(gh, base, "branch", f"refs/heads/{branch}", f"the branch {branch}",
                           {"deletion", "non_fast_forward", "pull_request"},
                           "restricting deletions and force pushes and requiring a reviewed pull request")
    return gaps


def _protected(gh: GitHub, base: str, target: str, wanted: str, shown: str, rules: set, how: str) -> list[Gap]:
    """A `target` ruleset that covers `wanted` with `rules`, enforced, excluding none of it, that only
    maintainers may bypass; else one line for each ruleset that meant to and falls short (what it
    lacks), or one saying there is none."""
    everything = "~ALL" if target == "tag" else "~DEFAULT_BRANCH"
    gaps = []
    for summary in gh.listing(f"{base}/rulesets?includes_parents=true&per_page=100"):
        if not isinstance(summary, dict) or summary.get("target") != target:
            continue
        ruleset = gh.get(f"{base}/rulesets/{summary.get('id')}") or {}
        ref_name = (ruleset.get("conditions") or {}).get("ref_name") or {}
        names, excluded = ref_name.get("include") or [], ref_name.get("exclude") or []
        kinds = {r.get("type") for r in ruleset.get("rules") or [] if isinstance(r, dict)}
        if not (wanted in names or "~ALL" in names or everything in names) or not rules <= kinds:
            continue  # not one that protects it: it claims nothing here
        lacks, fixes = [], []
        if ruleset.get("enforcement") != "active":  # evaluate only reports, disabled does nothing
            lacks.append(f"its enforcement is {untrusted.safe(ruleset.get('enforcement'), limit=20)!r}, not active")
            fixes.append("set its enforcement status to Active")
        if overlap := [str(x) for x in excluded if _may_overlap(str(x), wanted)]:
            lacks.append(f"it excludes {', '.join(repr(untrusted.safe(x, limit=60)) for x in overlap)}")
            fixes.append("remove that exclusion")
        # bypass_actors is optional in GitHub's answer (left out, it seems, for a token that may not
        # edit the ruleset, as an organization's read with a repository admin's): then unknown, not none
        if not isinstance(ruleset.get("bypass_actors"), list):
            lacks.append("who may bypass it cannot be read with this token")
            fixes.append("run preflight with a token that may edit the ruleset (an organization owner's for "
                         "an organization ruleset), or check its bypass list by hand")
        bypass = [_actor(a) for a in ruleset.get("bypass_actors") or []
                  if isinstance(a, dict) and not _maintainers(a)
                  and not (target == "tag" and a.get("bypass_mode") == "pull_request")]  # no tag comes by one
        if bypass:
            lacks.append(f"{', '.join(bypass)} may bypass it")
            fixes.append("let only the Maintain or Admin role (or organization admins) bypass it")
        if not lacks:
            return []
        gaps.append(Gap(f"the {target} ruleset {untrusted.safe(ruleset.get('name') or summary.get('name'), limit=60)!r} "
                        f"leaves {shown} open ({'; '.join(lacks)})",
                        f"{', '.join(fixes)} (Settings -> Rules -> Rulesets)"))
    return gaps or [Gap(f"no active {target} ruleset protects {shown}",
                        f"add one (Settings -> Rules -> Rulesets -> New {target} ruleset) targeting {shown}, "
                        f"{how}, with only maintainers allowed to bypass")]


def _may_overlap(pattern: str, wanted: str) -> bool:
    """Whether some ref may match both patterns (fnmatch-style, as GitHub's ref_name): unless the
    parts before their first wildcard part ways, assume so."""
    if pattern == "~ALL":
        return True
    first, second = (re.split(r"[*?\[]", p, maxsplit=1)[0] for p in (pattern, wanted))
    return first.startswith(second) or second.startswith(first)


def _maintainers(actor: dict) -> bool:
    return actor.get("actor_type") in OWNERS or \
        (actor.get("actor_type") == "RepositoryRole" and actor.get("actor_id") in MAINTAINER_ROLES)


def _actor(actor: dict) -> str:
    """A bypass actor, in words."""
    kind, number = str(actor.get("actor_type")), untrusted.safe(str(actor.get("actor_id")), limit=20)
    if kind == "RepositoryRole":
        return "the Write role (anyone with push rights)" if actor.get("actor_id") == 4 else f"the custom role {number}"
    if kind == "DeployKey":
        return "deploy keys"
    words = {"Team": "the team", "Integration": "the GitHub App"}.get(kind) or untrusted.safe(kind, limit=30)
    return f"{words} {number}"


def _runner_gaps(gh: GitHub, repository: str, settings: Settings) -> list[Gap]:
    """An online runner with the MI300X labels in an organization runner group that only this
    repository may use, and only its smoke workflow on v* tags (the reusable workflow the smoke job is
    defined in: a runner group judges a job by its own workflow); and no runner with those labels
    anywhere else: a runner of the repository itself (or of a group open to more) can be reached by
    any workflow anyone with push rights writes, and `runs-on` takes whichever runner comes."""
    wanted, owner = {label.casefold() for label in settings.mi300x_labels}, repository.split("/")[0]
    allowed = f"{repository}/{settings.smoke_workflow}@refs/tags/{settings.tags}"
    fix = (f"register the MI300X host as an ephemeral runner with those labels in an organization runner group "
           f"limited to {repository} and to the workflow {allowed} (docs/release.md, GitHub set-up)")

    def mi300x(runners: list, online: bool) -> bool:  # labels match as runs-on matches them, in any case
        return any(isinstance(r, dict) and (r.get("status") == "online" or not online) and
                   wanted <= {str(label.get("name")).casefold() for label in r.get("labels") or []
                              if isinstance(label, dict)} for r in runners)

    try:
        groups = gh.listing(f"/orgs/{owner}/actions/runner-groups?per_page=100", "runner_groups")
    except AuthError:
        groups = []  # not an organization the token may read: the repository's own runners are all there are
    kept, gaps = False, []
    for group in groups:
        if not isinstance(group, dict):
            continue
        where = f"/orgs/{owner}/actions/runner-groups/{group.get('id')}"
        runners = gh.listing(f"{where}/runners?per_page=100", "runners")
        if not mi300x(runners, online=False):  # an offline one counts where it is open: it comes back
            continue
        names = {r.get("full_name") for r in gh.listing(f"{where}/repositories?per_page=100", "repositories")
                 if isinstance(r, dict)}
        if group.get("visibility") == "selected" and names == {repository} and \
                group.get("restricted_to_workflows") and group.get("selected_workflows") == [allowed]:
            kept = kept or mi300x(runners, online=True)
            continue
        gaps.append(Gap(f"the runner group {untrusted.safe(group.get('name'), limit=60)!r} with an MI300X runner is "
                        f"open to more than {repository}'s {settings.smoke_workflow} on {settings.tags} tags", fix))
    if mi300x(gh.listing(f"/repos/{repository}/actions/runners?per_page=100", "runners"), online=False):
        gaps.append(Gap("an MI300X runner is registered to the repository itself, where any workflow can reach it",
                        "remove it (Settings -> Actions -> Runners); " + fix))
    if not kept and not gaps:
        gaps.append(Gap(f"no online runner has the labels {', '.join(settings.mi300x_labels)}", fix))
    return gaps


def _package_gaps(gh: GitHub, repository: str, settings: Settings) -> list[Gap]:
    owner = repository.split("/")[0]
    for scope in ("orgs", "users"):
        try:
            found = gh.get(f"/{scope}/{owner}/packages/container/{settings.package}")
        except AuthError:
            found = None
        if found:
            linked = ((found.get("repository") or {}).get("full_name") or "")
            if linked.lower() != repository.lower():
                return [Gap(f"the GHCR package {settings.package} is linked to "
                            f"{untrusted.safe(linked, limit=80) or 'no repository'}, not {repository}",
                            f"connect it to {repository} (the package's settings -> Manage Actions access), or the "
                            f"release's GITHUB_TOKEN cannot push it")]
            return []
    return []  # not made yet: the first release's push makes it, linked to this repository


def checkout_gaps(project: Path) -> tuple[Settings, list[Gap]]:
    """All preflight sees without GitHub's API: the workflows held to .github/release-settings.yaml
    (InputError where one is not), and what the checkout itself lacks."""
    from .settings import check_workflows

    settings = check_workflows(project)
    return settings, repository_gaps(project, settings)


def preflight(project: Path, repository: str, gh: GitHub) -> list[Gap]:
    """Every gap between this checkout and GitHub's settings and what a release needs, in order."""
    settings, gaps = checkout_gaps(project)
    return gaps + github_gaps(gh, repository, settings)
