"""A job run again ("Re-run failed jobs") uploads its artifact again under the same name. GitHub's
artifact service (v4) keeps one artifact per name in a run and refuses a second (409 Conflict):
upload-artifact then fails, unless asked to `overwrite` (it deletes the first, then uploads).

There is no GitHub here, and act's artifact server takes a second upload of a name without a word,
so the service is a stand-in written from that rule, and it says so. What runs is the vendored
upload-artifact itself (node), with the `with:` inputs of each upload step of the committed
workflows, twice in one run: the second must succeed."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from support import ROOT

pytestmark = pytest.mark.slow
ACTION = ROOT / ".github" / "rehearsal" / "actions" / "upload-artifact" / "dist" / "upload" / "index.js"
SERVICE = "/twirp/github.actions.results.api.v1.ArtifactService/"


class Service(BaseHTTPRequestHandler):
    """GitHub's artifact service as far as its one rule goes: a name once per run."""
    names: set = set()
    deleted: list = []

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (http.server's names)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        call = self.path[len(SERVICE):]
        wanted = body.get("nameFilter") or body.get("name_filter")  # a StringValue: a plain string in JSON
        name = body.get("name") or (wanted.get("value") if isinstance(wanted, dict) else wanted)
        if call == "CreateArtifact":
            if name in self.names:
                return self._json(409, {"code": "already_exists", "msg": "an artifact with this name already exists "
                                                                         "on the workflow run"})
            self.names.add(name)
            port = self.connection.getsockname()[1]  # this server's
            return self._json(200, {"ok": True, "signedUploadUrl": f"http://127.0.0.1:{port}/blob/{name}?sig=x"})
        if call == "FinalizeArtifact":
            return self._json(200, {"ok": True, "artifactId": "1"})
        if call == "ListArtifacts":
            found = [{"name": name, "databaseId": "1", "size": "1"}] if name in self.names else []
            return self._json(200, {"artifacts": found})
        if call == "DeleteArtifact":
            self.names.discard(name)
            self.deleted.append(name)
            return self._json(200, {"ok": True, "artifactId": "1"})
        return self._json(404, {"code": "not_found", "msg": call})

    def do_PUT(self) -> None:  # noqa: N802 (http.server's names)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


def upload_steps() -> list:
    found = []
    for path in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        workflow = path.name
        doc = yaml.safe_load(path.read_text())
        for job_id, job in doc["jobs"].items():
            for step in job.get("steps", []):  # a job that calls a workflow has none: its own file is read
                if "actions/upload-artifact@" in step.get("uses", ""):
                    found.append(pytest.param(step["with"], id=f"{workflow}:{job_id}:{step['with']['name']}"))
    return found


def upload(inputs: dict, port: int, workspace) -> subprocess.CompletedProcess:
    scope = base64.urlsafe_b64encode(json.dumps({"scp": "Actions.Results:1:1"}).encode()).decode().rstrip("=")
    env = {"PATH": os.environ["PATH"], "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(workspace),
           "GITHUB_REPOSITORY": "dsv4-mi300x/bakery", "GITHUB_RUN_ID": "1",
           "ACTIONS_RUNTIME_TOKEN": f"e30.{scope}.x", "ACTIONS_RESULTS_URL": f"http://127.0.0.1:{port}/"}
    action = yaml.safe_load((ACTION.parent.parent.parent / "action.yml").read_text())
    given = {k: v.get("default", "") for k, v in action["inputs"].items()}  # as the runner fills them in
    for key, value in {**given, **inputs}.items():
        env[f"INPUT_{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return subprocess.run(["node", str(ACTION)], env=env, cwd=workspace, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("inputs", upload_steps())
def test_a_job_run_again_uploads_its_artifact_again(inputs, tmp_path):
    for line in str(inputs["path"]).splitlines():  # what the step would have made
        target = tmp_path / line.strip()
        if line.strip().endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            (target / "x").write_text("x")
        elif line.strip():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("x")
    Service.names, Service.deleted = set(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        first = upload(inputs, server.server_address[1], tmp_path)
        assert first.returncode == 0, first.stdout[-2000:]
        again = upload(inputs, server.server_address[1], tmp_path)
        assert again.returncode == 0, again.stdout[-2000:]
        assert Service.deleted == [inputs["name"]]  # the first attempt's, replaced
        # the control: the same step without overwrite fails on the second attempt, as on GitHub
        bare = upload({k: v for k, v in inputs.items() if k != "overwrite"}, server.server_address[1], tmp_path)
        assert bare.returncode != 0 and "already exists" in bare.stdout + bare.stderr
    finally:
        server.shutdown()
