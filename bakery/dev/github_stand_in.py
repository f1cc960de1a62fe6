"""A stand-in for the GitHub API, for rehearsals only: the nightly workflow's `gh` calls (pull requests,
labels, issues) cannot reach GitHub from here. It serves HTTPS on 127.0.0.1 with a certificate of its
own (its CA goes to the runner as SSL_CERT_FILE, `gh` is pointed at it with GH_HOST), answers the few
REST and GraphQL requests `gh` makes for `pr view/create/edit`, `label create` and `issue
list/create/edit` with the smallest bodies `gh` accepts, keeps the pull requests and issues it was
asked to open, and records every request for the test to read. It is not GitHub: it checks no
permission but the token, and knows nothing else.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Request:
    method: str
    path: str
    authorization: str
    body: dict


@dataclass
class State:
    owner: str
    name: str
    token: str
    requests: list[Request] = field(default_factory=list)
    pulls: list[dict] = field(default_factory=list)
    issues: list[dict] = field(default_factory=list)
    labels: dict[str, dict] = field(default_factory=dict)


def certificate(folder: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a CA of the rehearsal's own and a leaf for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
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
                 "labelNames": [n for n, l in state.labels.items() if l["node_id"] in (got.get("labelIds") or [])],
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
        issue = next((i for i in state.issues if i["number"] == variables.get("number")), None)
        return {"repository": {"hasIssuesEnabled": True, "issue": issue and {
            "__typename": "Issue", **{k: issue[k] for k in ("id", "number", "title", "body", "url")}}}}
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
        repo["labels"] = {"nodes": [{"id": l["node_id"], "name": n} for n, l in state.labels.items()],
                          "pageInfo": {"hasNextPage": False, "endCursor": ""}}
    data = {"repository": repo, "viewer": {"login": "rehearsal", "id": "U_1"}}
    return data


def _handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # the requests are recorded, not printed
            pass

        def _answer(self, status: int, body) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("X-Oauth-Scopes", "repo, read:org")
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
            return self._answer(404, {"message": "Not Found (the GitHub stand-in does not serve this)"})

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    return Handler


class GitHubStandIn:
    """`with GitHubStandIn(folder, "owner", "repo", token) as gh:` -> gh.host, gh.ca, gh.state."""

    def __init__(self, folder: Path, owner: str, name: str, token: str, port: int = 443):
        self.ca, cert, key = certificate(folder)
        self.state = State(owner, name, token)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self.state))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "GitHubStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
