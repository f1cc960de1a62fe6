"""A stand-in for the GitHub API, for rehearsals and tests only: the nightly workflow's `gh` calls (pull
requests, labels, issues), the release's watch on its MI300X job and `invoke preflight` cannot reach
GitHub from here. It serves HTTPS on 127.0.0.1 with a certificate of its own (its CA goes to the
runner as SSL_CERT_FILE, `gh` is pointed at it with GH_HOST, our client with GITHUB_API_URL), answers
the few REST and GraphQL requests `gh` makes for `pr view/create/edit`, `label create` and `issue
list/create/edit` with the smallest bodies `gh` accepts, keeps the pull requests and issues it was
asked to open, serves a repository's settings (`Repo`: variables, secrets, environments, rulesets,
runner groups and runners, a package) in the shapes of GitHub's REST documentation, lists and
deletes container package versions (`packages`: GHCR's deletes, which take no registry DELETE), pages every
listing as GitHub does (`per_page`, a Link header naming the next page), answers a run's jobs with
what a caller says they are (the rehearsal: what act's log shows), and records every request for
the test to read. It is not GitHub: it checks no permission but the token, and knows nothing else.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol


@dataclass
class Request:
    method: str
    path: str
    authorization: str
    body: dict


@dataclass
class Environment:
    """An environment's settings: reviewers (logins), whether they may approve their own run, the tag
    and branch name patterns its deployments are limited to (neither: any ref), its secrets' names
    and variables."""
    reviewers: list[str] = field(default_factory=lambda: ["maintainer"])
    prevent_self_review: bool = True
    tags: list[str] = field(default_factory=lambda: ["v*"])
    branches: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    variables: dict[str, str] = field(default_factory=dict)


# who may bypass a ruleset, as GitHub names them: the Admin role (RepositoryRole 5; Maintain is 2,
# Write 4), organization admins (OrganizationAdmin 1), a team, an app (Integration), a deploy key
ADMIN_ROLE = {"actor_id": 5, "actor_type": "RepositoryRole", "bypass_mode": "always"}


@dataclass
class Ruleset:
    """A tag ruleset: the ref patterns it includes and excludes (`refs/tags/v*`, `~ALL`), its
    enforcement ("active", "evaluate" or "disabled"), who may bypass it, and its rules' types."""
    include: list[str]
    exclude: list[str] = field(default_factory=list)
    enforcement: str = "active"
    # None: GitHub leaves the key out, as for a token that may not edit the ruleset
    bypass_actors: list[dict] | None = field(default_factory=lambda: [dict(ADMIN_ROLE)])
    rules: list[str] = field(default_factory=lambda: ["creation", "update", "deletion"])
    target: str = "tag"  # or "branch"


@dataclass
class RunnerGroup:
    """An organization runner group: its visibility ("all", "selected" or "private"), the
    repositories and workflows it is limited to, and its online runners' labels."""
    name: str
    visibility: str = "selected"
    repositories: list[str] = field(default_factory=list)
    workflows: list[str] = field(default_factory=list)
    runners: list[list[str]] = field(default_factory=list)


@dataclass
class Repo:
    """What the stand-in's repository holds in its settings."""
    variables: dict[str, str] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    environments: dict[str, Environment] = field(default_factory=dict)
    org_secrets: list[str] = field(default_factory=list)  # the organization's, given to this repository
    tag_rulesets: list[Ruleset] = field(default_factory=list)
    branch_rulesets: list[Ruleset] = field(default_factory=list)
    groups: list[RunnerGroup] = field(default_factory=list)  # the organization's runner groups
    repo_runners: list[list[str]] = field(default_factory=list)  # online runners of the repository itself
    package: tuple[str, str] | None = None  # (name, the repository it is linked to)
    page_size: int = 100  # the most items a listing's page holds (GitHub's per_page limit is 100)


def ready_repo(settings, public_keys: dict[str, str], owner: str, name: str) -> Repo:
    """A repository set up as .github/release-settings.yaml asks (release/settings.Settings), the
    public keys' PEMs by role: what preflight must find nothing missing in."""
    return Repo(variables={var: public_keys[role] for var, role in settings.variables.items()},
                environments={e.name: Environment(reviewers=[] if e.branch else ["maintainer"],
                                                  tags=[] if e.branch else [settings.tags],
                                                  branches=[e.branch] if e.branch else [], secrets=list(e.secrets),
                                                  variables=dict.fromkeys(e.variables, "/data/hf/snapshot"))
                              for e in settings.environments.values()},
                tag_rulesets=[Ruleset([f"refs/tags/{settings.tags}"])],
                branch_rulesets=[Ruleset([f"refs/heads/{b}"], target="branch",
                                         rules=["deletion", "non_fast_forward", "pull_request"])
                                 for b in sorted({e.branch for e in settings.environments.values() if e.branch})],
                groups=[RunnerGroup("mi300x", "selected", [f"{owner}/{name}"],
                                    [f"{owner}/{name}/{settings.smoke_workflow}@refs/tags/{settings.tags}"],
                                    [list(settings.mi300x_labels)])],
                package=(settings.package, f"{owner}/{name}"))


class Package(Protocol):
    """A container package's versions, as GitHub's package service sees GHCR's store."""

    def versions(self) -> list[tuple[str, list[str]]]: ...  # [(manifest digest, its tags)]

    def delete(self, digest: str) -> None: ...


@dataclass
class RegistryPackage:
    """A package whose store is a docker-registry repository served here: every manifest its storage
    holds is a version, tagged or not (as GHCR lists them: a bundle pushed by digest is an untagged
    version; the registry's API lists tags only), deleted with the registry's own DELETE."""
    host: str
    repo: str
    storage: Path  # the registry's filesystem rootdirectory

    def versions(self) -> list[tuple[str, list[str]]]:
        root = self.storage / "docker" / "registry" / "v2" / "repositories" / self.repo / "_manifests"
        tags: dict[str, list[str]] = {}
        for link in (root / "tags").glob("*/current/link"):
            tags.setdefault(link.read_text().strip(), []).append(link.parent.parent.name)
        return [(f"sha256:{link.parent.name}", sorted(tags.get(f"sha256:{link.parent.name}", [])))
                for link in sorted((root / "revisions" / "sha256").glob("*/link"))]

    def delete(self, digest: str) -> None:
        import requests

        requests.delete(f"http://{self.host}/v2/{self.repo}/manifests/{digest}", timeout=30).raise_for_status()


def version_id(digest: str) -> int:
    """A version's id: GitHub's are numbers; here one stable per digest."""
    return int(digest.split(":")[-1][:12], 16)


@dataclass
class State:
    owner: str
    name: str
    token: str
    requests: list[Request] = field(default_factory=list)
    pulls: list[dict] = field(default_factory=list)
    issues: list[dict] = field(default_factory=list)
    labels: dict[str, dict] = field(default_factory=dict)
    repo: Repo = field(default_factory=Repo)
    run_jobs: Callable[[], list[dict]] | None = None  # [{"name", "status"}] of the run being watched
    cancelled: list[str] = field(default_factory=list)  # run ids a caller asked to cancel
    workflows: Path | None = None  # the checkout act runs: its workflows say which jobs may ask for a token
    oidc_request_token: str = ""  # what a job presents to ask for its OIDC token (ACTIONS_ID_TOKEN_REQUEST_TOKEN)
    minted: list[str] = field(default_factory=list)  # the job_workflow_ref of each token given
    packages: dict[str, Package] = field(default_factory=dict)  # container packages by name, with versions


def rest(state: State, method: str, path: str) -> tuple[int, object]:
    """(status, body) of the settings and run endpoints, in the shapes of GitHub's REST API."""
    repo, base = state.repo, f"/api/v3/repos/{state.owner}/{state.name}"
    if not path.startswith(base) and not path.startswith("/api/v3/orgs/") and not path.startswith("/api/v3/users/"):
        return 404, None
    rest_of = path[len(base):] if path.startswith(base) else path
    if method == "GET" and (m := re.fullmatch(r"/actions/variables/(\w+)", rest_of)):
        value = repo.variables.get(m.group(1))
        return (200, {"name": m.group(1), "value": value}) if value is not None else (404, None)
    if method == "GET" and rest_of == "/actions/secrets":
        return 200, {"total_count": len(repo.secrets), "secrets": [{"name": n} for n in repo.secrets]}
    if method == "GET" and (m := re.fullmatch(r"/environments/([\w.-]+)(/[\w-]+)?", rest_of)):
        env = repo.environments.get(m.group(1))
        if env is None:
            return 404, None
        if m.group(2) == "/secrets":
            return 200, {"total_count": len(env.secrets), "secrets": [{"name": n} for n in env.secrets]}
        if m.group(2) == "/variables":
            return 200, {"total_count": len(env.variables),
                         "variables": [{"name": k, "value": v} for k, v in env.variables.items()]}
        if m.group(2) == "/deployment-branch-policies":
            named = [(t, "tag") for t in env.tags] + [(b, "branch") for b in env.branches]
            return 200, {"total_count": len(named), "branch_policies": [{"id": i + 1, "name": n, "type": kind}
                                                                        for i, (n, kind) in enumerate(named)]}
        if m.group(2):
            return 404, None
        rules = [{"id": 1, "type": "required_reviewers", "prevent_self_review": env.prevent_self_review,
                  "reviewers": [{"type": "User", "reviewer": {"login": r}} for r in env.reviewers]}] \
            if env.reviewers else []
        policy = {"protected_branches": False, "custom_branch_policies": True} if env.tags or env.branches else None
        return 200, {"name": m.group(1), "protection_rules": rules, "deployment_branch_policy": policy}
    rulesets = repo.tag_rulesets + repo.branch_rulesets  # ids from 1, tags' first

    def ruleset_name(i: int, r: Ruleset) -> str:
        return f"{'tags' if r.target == 'tag' else 'branches'} {i + 1}"

    if method == "GET" and rest_of == "/rulesets":
        return 200, [{"id": i + 1, "name": ruleset_name(i, r), "target": r.target, "source_type": "Repository",
                      "enforcement": r.enforcement} for i, r in enumerate(rulesets)]
    if method == "GET" and (m := re.fullmatch(r"/rulesets/(\d+)", rest_of)):
        i = int(m.group(1)) - 1
        if not 0 <= i < len(rulesets):
            return 404, None
        r = rulesets[i]
        return 200, {"id": i + 1, "name": ruleset_name(i, r), "target": r.target, "source_type": "Repository",
                     "enforcement": r.enforcement,
                     "conditions": {"ref_name": {"include": r.include, "exclude": r.exclude}},
                     "rules": [{"type": t} for t in r.rules]} \
            | ({"bypass_actors": r.bypass_actors} if r.bypass_actors is not None else {})
    def runners(labels_of):
        return {"total_count": len(labels_of), "runners": [
            {"id": i + 1, "name": f"runner-{i + 1}", "status": "online", "busy": False,
             "labels": [{"name": label} for label in labels]} for i, labels in enumerate(labels_of)]}

    if method == "GET" and rest_of == "/actions/runners":
        return 200, runners(repo.repo_runners)
    if method == "GET" and rest_of == "/actions/organization-secrets":
        return 200, {"total_count": len(repo.org_secrets), "secrets": [{"name": n} for n in repo.org_secrets]}
    org = f"/api/v3/orgs/{state.owner}/actions/runner-groups"
    if method == "GET" and rest_of == org:  # ids from 7 on
        return 200, {"total_count": len(repo.groups), "runner_groups": [
            {"id": 7 + i, "name": g.name, "visibility": g.visibility, "default": False,
             "restricted_to_workflows": bool(g.workflows), "selected_workflows": g.workflows}
            for i, g in enumerate(repo.groups)]}
    if method == "GET" and (m := re.fullmatch(rf"{org}/(\d+)/(runners|repositories)", rest_of)) and \
            0 <= int(m.group(1)) - 7 < len(repo.groups):
        g = repo.groups[int(m.group(1)) - 7]
        if m.group(2) == "runners":
            return 200, runners(g.runners)
        return 200, {"total_count": len(g.repositories), "repositories": [{"full_name": r} for r in g.repositories]}
    versions = re.fullmatch(r"/api/v3/(?:orgs|users)/([\w.-]+)/packages/container/([\w.%-]+)/versions(?:/(\d+))?",
                            rest_of)
    if versions and versions.group(1) == state.owner and \
            (package := state.packages.get(urllib.parse.unquote(versions.group(2)))):
        held = package.versions()
        listed = [{"id": version_id(d), "name": d, "metadata": {"package_type": "container", "container": {"tags": t}}}
                  for d, t in held]
        if versions.group(3) is None:
            return (200, listed) if method == "GET" else (404, None)
        one = next((i for i, (d, _) in enumerate(held) if version_id(d) == int(versions.group(3))), None)
        if one is None:
            return 404, None
        if method == "DELETE":
            package.delete(held[one][0])
            return 204, None
        return (200, listed[one]) if method == "GET" else (404, None)
    if method == "GET" and (m := re.fullmatch(r"/api/v3/(?:orgs|users)/([\w.-]+)/packages/container/([\w.%-]+)",
                                              rest_of)) and m.group(1) == state.owner and \
            urllib.parse.unquote(m.group(2)) in state.packages:
        return 200, {"name": urllib.parse.unquote(m.group(2)), "package_type": "container", "repository": None}
    if method == "GET" and (m := re.fullmatch(r"/api/v3/(?:orgs|users)/([\w.-]+)/packages/container/([\w.-]+)",
                                              rest_of)):
        if repo.package is None or repo.package[0] != m.group(2) or m.group(1) != state.owner:
            return 404, None
        return 200, {"name": repo.package[0], "package_type": "container",
                     "repository": {"full_name": repo.package[1]} if repo.package[1] else None}
    if method == "GET" and (m := re.fullmatch(r"/actions/runs/(\d+)/jobs", rest_of)):
        jobs = state.run_jobs() if state.run_jobs else []
        return 200, {"total_count": len(jobs), "jobs": jobs}
    if method == "POST" and (m := re.fullmatch(r"/actions/runs/(\d+)/cancel", rest_of)):
        state.cancelled.append(m.group(1))
        return 202, {}
    return 404, None


def paged(state: State, body: object, host: str, path: str, query: str) -> tuple[object, str | None]:
    """One page of a listing (a bare array, or {total_count, NAME: [...]}) as GitHub pages it:
    `per_page` (30 unless asked, at most the repository's page_size) from `page` 1, and the Link
    header naming the next and last pages while more follow. Any other answer whole."""
    named = [k for k, v in body.items() if isinstance(v, list)] if isinstance(body, dict) else []
    if isinstance(body, list):
        items = body
    elif isinstance(body, dict) and "total_count" in body and len(named) == 1:
        items = body[named[0]]
    else:
        return body, None
    asked = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
    per_page = max(1, min(int(asked.get("per_page", "30")), state.repo.page_size))
    page = max(1, int(asked.get("page", "1")))
    chunk = items[(page - 1) * per_page:page * per_page]
    last = max(1, -(-len(items) // per_page))
    link = None
    if page < last:
        def url(n: int) -> str:
            return f"https://{host}{path}?{urllib.parse.urlencode({**asked, 'per_page': per_page, 'page': n})}"
        link = f'<{url(page + 1)}>; rel="next", <{url(last)}>; rel="last"'
    return (chunk if isinstance(body, list) else {**body, named[0]: chunk}), link


def certificate(folder: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a CA of the rehearsal's own and a leaf for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bakery rehearsal CA (GitHub stand-in)")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(leaf.public_bytes(pem))
    (folder / "server.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return folder / "ca.pem", folder / "server.pem", folder / "server.key"


def _repo(state: State) -> dict:
    return {"id": "R_1", "name": state.name, "owner": {"login": state.owner, "id": "U_1"},
            "nameWithOwner": f"{state.owner}/{state.name}", "url": f"https://github.com/{state.owner}/{state.name}",
            "defaultBranchRef": {"name": "main"}, "viewerPermission": "WRITE", "hasIssuesEnabled": True,
            "isPrivate": False, "parent": None, "mergeCommitAllowed": True, "rebaseMergeAllowed": True,
            "squashMergeAllowed": True}


def graphql(state: State, query: str, variables: dict) -> dict:
    """The answer to one of the GraphQL documents `gh` sends, by what it asks for."""
    if "createPullRequest" in query:
        got = variables.get("input", {})
        number = len(state.pulls) + 1
        pull = {"id": f"PR_{number}", "number": number, "state": "OPEN", "title": got.get("title"),
                "body": got.get("body"), "headRefName": got.get("headRefName"), "baseRefName": got.get("baseRefName"),
                "url": f"https://github.com/{state.owner}/{state.name}/pull/{number}"}
        state.pulls.append(pull)
        return {"createPullRequest": {"pullRequest": pull}}
    if "updatePullRequest" in query:
        got = variables.get("input", {})
        pull = next(p for p in state.pulls if p["id"] == got.get("pullRequestId"))
        pull.update({k: v for k, v in got.items() if k in ("title", "body")})
        return {"updatePullRequest": {"__typename": "UpdatePullRequestPayload"}}
    if "createIssue" in query:
        got = variables.get("input", {})
        number = 100 + len(state.issues) + 1
        issue = {"id": f"I_{number}", "number": number, "state": "OPEN", "title": got.get("title"), "body": got.get("body"),
                 "labelNames": [n for n, label in state.labels.items() if label["node_id"] in (got.get("labelIds") or [])],
                 "url": f"https://github.com/{state.owner}/{state.name}/issues/{number}"}
        state.issues.append(issue)
        return {"createIssue": {"issue": issue}}
    if "updateIssue" in query:
        got = variables.get("input", {})
        issue = next(i for i in state.issues if i["id"] == got.get("id"))
        issue.update({k: v for k, v in got.items() if k in ("title", "body")})
        return {"updateIssue": {"__typename": "UpdateIssuePayload"}}
    if "__type(name:" in query:  # gh asks which fields the server's Issue type has
        return {"Issue": {"fields": [{"name": n} for n in ("id", "number", "title", "body", "state", "url", "labels",
                                                             "stateReason", "closed")]}}
    if "PullRequestProjectItems" in query or "IssueProjectItems" in query:  # edit: no projects here
        kind = "pullRequest" if "PullRequest" in query else "issue"
        return {"repository": {kind: {"projectItems": {"nodes": [], "pageInfo": {"hasNextPage": False, "endCursor": ""}}}}}
    if "IssueSearch" in query:  # issue list --label L --state open
        words = dict(w.split(":", 1) for w in variables.get("query", "").split() if ":" in w)
        found = [{"number": i["number"], "title": i["title"], "state": i["state"], "url": i["url"]} for i in state.issues
                 if i["state"].lower() == words.get("state", "open") and words.get("label") in i["labelNames"]]
        return {"repository": {"hasIssuesEnabled": True},
                "search": {"issueCount": len(found), "nodes": found, "pageInfo": {"hasNextPage": False, "endCursor": ""}}}
    if "IssueByNumber" in query:  # issue edit N
        found_issue = next((i for i in state.issues if i["number"] == variables.get("number")), None)
        return {"repository": {"hasIssuesEnabled": True, "issue": found_issue and {
            "__typename": "Issue", **{k: found_issue[k] for k in ("id", "number", "title", "body", "url")}}}}
    if "RepositoryResolveMetadataIDs" in query:  # label names -> node ids, one alias each
        wanted = re.findall(r'(\w+): label\(name:"([^"]*)"\)', query)
        return {"repository": {alias: {"id": state.labels[name]["node_id"], "name": name}
                               for alias, name in wanted if name in state.labels}}
    repo = _repo(state)
    if "pullRequests" in query:  # pr view BRANCH: the open ones for that head
        head = variables.get("headRefName")
        found = [p for p in state.pulls if p["headRefName"] == head and (p["state"] == "OPEN" or not variables.get("states"))]
        repo["pullRequests"] = {"totalCount": len(found), "nodes": found, "pageInfo": {"hasNextPage": False, "endCursor": ""}}
    if "labels" in query:
        repo["labels"] = {"nodes": [{"id": label["node_id"], "name": n} for n, label in state.labels.items()],
                          "pageInfo": {"hasNextPage": False, "endCursor": ""}}
    data = {"repository": repo, "viewer": {"login": "rehearsal", "id": "U_1"}}
    return data


def _handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # the requests are recorded, not printed
            pass

        def _answer(self, status: int, body, link: str | None = None) -> None:
            raw = json.dumps(body).encode() if status != 204 else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            if status != 204:
                self.send_header("Content-Length", str(len(raw)))
            self.send_header("X-Oauth-Scopes", "repo, read:org")
            if link:
                self.send_header("Link", link)
            self.end_headers()
            self.wfile.write(raw)

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"raw": raw.decode(errors="replace")}
            auth = self.headers.get("Authorization", "")
            state.requests.append(Request(self.command, self.path, auth, body))
            if self.path.split("?")[0] == OIDC_PATH:
                own = self.server.server_address
                return self._answer(*job_token(state, auth, int(self.client_address[1]),
                                               int(own[1]) if isinstance(own, tuple) else 0))
            if auth not in (f"token {state.token}", f"Bearer {state.token}"):
                return self._answer(401, {"message": "Bad credentials"})
            path = self.path.split("?")[0]
            if path == "/api/graphql":
                return self._answer(200, {"data": graphql(state, body.get("query", ""), body.get("variables") or {})})
            labels = re.fullmatch(rf"/api/v3/repos/{state.owner}/{state.name}/labels(?:/([^/]+))?", path)
            if labels and self.command in ("POST", "PATCH"):
                name = body.get("new_name") or body.get("name") or labels.group(1)
                label = {"id": len(state.labels) + 1, "node_id": f"LA_{len(state.labels) + 1}", "name": name,
                         "description": body.get("description", ""), "color": body.get("color", "ededed")}
                state.labels[name] = state.labels.get(name, label) | {k: v for k, v in label.items() if k != "node_id"
                                                                      and k != "id"}
                return self._answer(201 if self.command == "POST" else 200, state.labels[name])
            if path in ("/api/v3/", "/api/v3/user", "/api/v3"):
                return self._answer(200, {"login": "rehearsal"})
            status, answer = rest(state, self.command, path)
            if status == 200:
                query = urllib.parse.urlsplit(self.path).query
                page, link = paged(state, answer, self.headers.get("Host", ""), path, query)
                return self._answer(status, page, link)
            if status != 404:
                return self._answer(status, answer)
            return self._answer(404, {"message": "Not Found (the GitHub stand-in does not serve this)"})

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    return Handler


OIDC_PATH = "/_oidc/token"  # ACTIONS_ID_TOKEN_REQUEST_URL, as act cannot give one


def job_token(state: State, auth: str, peer_port: int, own_port: int) -> tuple[int, dict]:
    """The OIDC token GitHub gives the job asking, for ACTIONS_ID_TOKEN_REQUEST_URL: GitHub knows the
    job from its runtime token; here, from the asking process's own environment (GITHUB_WORKFLOW,
    GITHUB_JOB, GITHUB_REF, GITHUB_EVENT_NAME, found by its TCP connection in /proc), and gives one
    only to a job whose workflow grants it `id-token: write`. Its job_workflow_ref names the workflow
    the job is defined in (a reusable one's own path, not its caller's). What this cannot show: a
    step could lie about its own environment, where GitHub's runtime token cannot be forged."""
    import yaml

    if not state.oidc_request_token or auth.lower() != f"bearer {state.oidc_request_token}".lower():
        return 401, {"message": "Bad request token"}
    env = _environ_of_peer(peer_port, own_port)
    workflow_name, job_id = env.get("GITHUB_WORKFLOW"), env.get("GITHUB_JOB")
    found: tuple[str, dict] | None = None
    root = state.workflows or Path("/nonexistent")
    for file in sorted(root.glob(".github/workflows/*.yml")):
        doc = yaml.safe_load(file.read_text())
        job = (doc.get("jobs") or {}).get(job_id)
        if doc.get("name") == workflow_name and isinstance(job, dict) and "steps" in job:
            found = (file.relative_to(root).as_posix(), job)
    if found is None:
        return 403, {"message": f"no job {job_id!r} of a workflow named {workflow_name!r} asks for a token"}
    path, job = found
    if (job.get("permissions") or {}).get("id-token") != "write":
        return 403, {"message": f"job {job_id} of {path} has no `id-token: write`: GitHub gives it no token"}
    ref, event = env.get("GITHUB_REF", ""), env.get("GITHUB_EVENT_NAME", "push")
    repository = f"{state.owner}/{state.name}"
    state.minted.append(f"{repository}/{path}@{ref}")
    return 200, {"value": oidc_token(repository, path, ref, event=event), "count": 1}


def _environ_of_peer(peer_port: int, own_port: int) -> dict[str, str]:
    """The environment of the local process holding the TCP connection from peer_port to own_port."""
    import os

    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
            if int(local, 16) == peer_port and int(remote, 16) == own_port:
                inode = fields[9]
    if inode is None:
        return {}
    wanted = f"socket:[{inode}]"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == wanted for fd in os.listdir(f"/proc/{pid}/fd")):
                raw = Path(f"/proc/{pid}/environ").read_bytes()
                return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        except OSError:
            continue
    return {}


class GitHubStandIn:
    """`with GitHubStandIn(folder, "owner", "repo", token) as gh:` -> gh.host, gh.ca, gh.state."""

    def __init__(self, folder: Path, owner: str, name: str, token: str, port: int = 443):
        self.ca, cert, key = certificate(folder)
        self.state = State(owner, name, token)
        self.api = f"https://127.0.0.1:{port}/api/v3"  # what GITHUB_API_URL names for our client
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self.state))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.api = f"https://{self.host}/api/v3"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> GitHubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def oidc_token(repository: str, job_workflow: str, ref: str, caller: str = ".github/workflows/release.yml",
               sha: str = "0" * 40, lifetime: int = 300, event: str = "push") -> str:
    """An OIDC token with the claims GitHub Actions puts in one for a job that a reusable workflow
    (`job_workflow`, a path in `repository`) runs for `caller` on `ref`. Signed with a throwaway key:
    the Sigstore stand-in's Fulcio does not check token signatures (real Fulcio checks GitHub's)."""
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec

    now = int(time.time())
    owner = repository.split("/")[0]
    claims = {"iss": "https://token.actions.githubusercontent.com", "aud": "sigstore", "iat": now, "nbf": now,
              "exp": now + lifetime, "sub": f"repo:{repository}:ref:{ref}", "repository": repository,
              "repository_owner": owner, "repository_id": "1", "repository_owner_id": "1",
              "repository_visibility": "public", "ref": ref, "ref_type": "tag" if ref.startswith("refs/tags/") else
              "branch", "sha": sha, "workflow": "release", "workflow_ref": f"{repository}/{caller}@{ref}",
              "workflow_sha": sha, "job_workflow_ref": f"{repository}/{job_workflow}@{ref}", "job_workflow_sha": sha,
              "event_name": event, "runner_environment": "github-hosted", "run_id": "1", "run_attempt": "1"}
    return jwt.encode(claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256")
