"""What the release asks of GitHub's API: `invoke preflight` (is this repository set up for a release?)
and `invoke await-runner` (has an MI300X runner taken the smoke job?).

There is no GitHub here: both talk to bakery/dev/github_stand_in.py over HTTPS, which serves a
repository's settings in the shapes GitHub's REST documentation gives them, and a run's jobs as the
test says they are. What is checked is our side: which settings count as a gap, each gap one line
saying what to do, the exit codes, the run cancelled when no runner comes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
from pathlib import Path

import pytest
import yaml

from bakery.dev import github_stand_in as stand_in
from bakery.errors import AuthError, EnvironmentProblem, InputError, RegistryError
from bakery.release import github, settings as settings_mod
from bakery.trust import keys
from bakery.trust.policy import ROLES
from support import ROOT, copy_project, invoke

OWNER, NAME, TOKEN = "dsv4-mi300x", "bakery", "t0ken"
SETTINGS = settings_mod.load(ROOT / settings_mod.SETTINGS)


@pytest.fixture(scope="module")
def public_keys(tmp_path_factory) -> dict[str, str]:
    where = tmp_path_factory.mktemp("keys")
    os.environ["BAKERY_KEY_PASSWORD"] = "pw"
    try:
        return {role: keys.generate(where, role)[1].read_text() for role in ROLES}
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]


@pytest.fixture
def gh(tmp_path, public_keys, monkeypatch):
    server = stand_in.GitHubStandIn(tmp_path / "tls", OWNER, NAME, TOKEN, port=0)
    server.state.repo = stand_in.ready_repo(SETTINGS, public_keys, OWNER, NAME)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(server.ca))
    with server:
        yield server


@pytest.fixture(scope="module")
def ready_project(tmp_path_factory) -> Path:
    """A checkout as it is before its first tag once the pin is locked and mirrored."""
    project = copy_project(tmp_path_factory.mktemp("ready") / "project")
    base = yaml.safe_load((project / "image" / "base.yaml").read_text())
    base["mirror"] = "ghcr.io/dsv4-mi300x/vllm-openai-rocm"
    (project / "image" / "base.yaml").write_text(yaml.safe_dump(base))
    lock = project / "overlays" / "overlays.lock"
    doc = yaml.safe_load(lock.read_text())  # JSON is YAML
    doc["base"] = base["image"]
    import json

    lock.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return project


def gaps(project: Path, server) -> list[str]:
    return [str(g) for g in github.preflight(project, f"{OWNER}/{NAME}", github.GitHub(TOKEN, server.api))]


def test_a_repository_set_up_as_the_settings_say_has_no_gap(ready_project, gh):
    assert gaps(ready_project, gh) == []
    result = invoke(ready_project, "preflight", "--repository", f"{OWNER}/{NAME}", "--api", gh.api,
                    env={"GITHUB_TOKEN": TOKEN})
    assert result.returncode == 0 and result.stdout.strip() == "ready: nothing a release needs is missing", result


def test_the_committed_checkout_still_lacks_its_lock_and_mirror(gh):
    """As today: the lock was made for the fixture, and base.yaml names no mirror."""
    found = gaps(ROOT, gh)
    assert len(found) == 2, found
    assert "overlays.lock was made for" in found[0] and "invoke rebase --base" in found[0]
    assert "names no mirror" in found[1] and "invoke mirror --to" in found[1]


def _env(repo, name="release"):
    return repo.environments[name]


def _registered_to_the_repository(r) -> None:
    r.repo_runners.append(r.groups.pop().runners[0])


MI300X = list(SETTINGS.mi300x_labels)
WRITE_ROLE = {"actor_id": 4, "actor_type": "RepositoryRole", "bypass_mode": "always"}


def _on_page_two(r) -> None:
    """Every listing one item a page: the organization's second secret is on page 2."""
    r.page_size = 1
    r.org_secrets += ["NPM_TOKEN", "BAKERY_SMOKE_SIGNING_KEY"]


# each: how a repository falls short, and words its one line must carry
SHORTFALLS = {
    "a public key missing": (lambda r: r.variables.pop("BAKERY_SMOKE_PUBLIC_KEY"),
                             "repository variable BAKERY_SMOKE_PUBLIC_KEY is missing or empty"),
    "a public key that is no key": (lambda r: r.variables.update(BAKERY_RELEASE_PUBLIC_KEY="release.pub"),
                                    "BAKERY_RELEASE_PUBLIC_KEY is not a PEM public key"),
    "an environment missing": (lambda r: r.environments.pop("rebuilder"), "environment rebuilder does not exist"),
    "no reviewers": (lambda r: setattr(_env(r), "reviewers", []), "environment release has no required reviewers"),
    "self-review allowed": (lambda r: setattr(_env(r, "smoke"), "prevent_self_review", False),
                            "environment smoke lets whoever started the run approve it"),
    "any ref may deploy": (lambda r: setattr(_env(r), "tags", []), "environment release is not limited to tags v*"),
    "another tag pattern": (lambda r: setattr(_env(r), "tags", ["release-*"]),
                            "environment release is not limited to tags v*"),
    "a secret missing": (lambda r: _env(r).secrets.remove("BAKERY_KEY_PASSWORD"),
                         "environment release lacks its secret BAKERY_KEY_PASSWORD"),
    "a variable missing": (lambda r: _env(r, "smoke").variables.clear(),
                           "environment smoke lacks its variable MODEL_SNAPSHOT"),
    "a key also a repository secret": (lambda r: r.secrets.append("BAKERY_SIGNING_KEY"),
                                       "BAKERY_SIGNING_KEY is also a repository (or organization) secret"),
    "a key also an organization secret": (lambda r: r.org_secrets.append("BAKERY_SMOKE_SIGNING_KEY"),
                                          "BAKERY_SMOKE_SIGNING_KEY is also a repository (or organization) secret"),
    "any branch may deploy too": (lambda r: _env(r).branches.append("*"),
                                  "environment release is not limited to tags v* (its branch rule '*' also let"),
    "any tag may deploy too": (lambda r: _env(r, "smoke").tags.append("*"),
                               "environment smoke is not limited to tags v* (its tag rule '*' also let"),
    "the prune environment open to any branch too": (lambda r: _env(r, "prune").branches.append("*"),
                                                     "environment prune is not limited to branch main (its branch "
                                                     "rule '*' also let"),
    "the prune environment open to tags instead": (lambda r: setattr(_env(r, "prune"), "branches", ["v*"]),
                                                   "environment prune is not limited to branch main"),
    "the prune token missing": (lambda r: _env(r, "prune").secrets.clear(),
                                "environment prune lacks its secret BAKERY_PRUNE_TOKEN"),
    "the prune token also a repository secret": (lambda r: r.secrets.append("BAKERY_PRUNE_TOKEN"),
                                                 "BAKERY_PRUNE_TOKEN is also a repository (or organization) secret"),
    "main unprotected (environment prune has no reviewer)": (
        lambda r: r.branch_rulesets.clear(), "no active branch ruleset protects the branch main"),
    "main's ruleset the Write role may bypass": (
        lambda r: r.branch_rulesets[0].bypass_actors.append(WRITE_ROLE),
        "the branch ruleset 'branches 2' leaves the branch main open (the Write role (anyone with push rights) "
        "may bypass it)"),
    "main's ruleset without force-push protection": (
        lambda r: r.branch_rulesets[0].rules.remove("non_fast_forward"), "no active branch ruleset protects the "
                                                                        "branch main"),
    "no tag ruleset": (lambda r: r.tag_rulesets.clear(), "no active tag ruleset protects v*"),
    "a tag ruleset excluding release tags": (lambda r: r.tag_rulesets[0].exclude.append("refs/tags/v1.*"),
                                             "the tag ruleset 'tags 1' leaves v* tags open (it excludes "
                                             "'refs/tags/v1.*')"),
    "a tag ruleset excluding every tag": (lambda r: r.tag_rulesets[0].exclude.append("~ALL"), "it excludes '~ALL'"),
    "a tag ruleset the Write role may bypass": (lambda r: r.tag_rulesets[0].bypass_actors.append(WRITE_ROLE),
                                                "leaves v* tags open (the Write role (anyone with push rights) may "
                                                "bypass it)"),
    "a tag ruleset an app may bypass": (lambda r: r.tag_rulesets[0].bypass_actors.append(
        {"actor_id": 15368, "actor_type": "Integration", "bypass_mode": "always"}),
        "the GitHub App 15368 may bypass it"),
    "a tag ruleset whose bypass list the token cannot read": (
        lambda r: setattr(r.tag_rulesets[0], "bypass_actors", None),
        "leaves v* tags open (who may bypass it cannot be read with this token)"),
    "a tag ruleset only evaluated": (lambda r: setattr(r.tag_rulesets[0], "enforcement", "evaluate"),
                                     "leaves v* tags open (its enforcement is 'evaluate', not active)"),
    "a tag ruleset disabled": (lambda r: setattr(r.tag_rulesets[0], "enforcement", "disabled"),
                               "its enforcement is 'disabled', not active"),
    "no MI300X runner": (lambda r: r.groups[0].runners.clear(),
                         "no online runner has the labels self-hosted, linux, x64, mi300x"),
    "a runner without the label": (lambda r: r.groups[0].runners.__setitem__(0, ["self-hosted", "linux", "x64"]),
                                   "no online runner has the labels"),
    "the runner registered to the repository": (_registered_to_the_repository,
                                                "registered to the repository itself, where any workflow can reach it"),
    "a second MI300X runner registered to the repository": (lambda r: r.repo_runners.append(MI300X),
                                                            "an MI300X runner is registered to the repository itself"),
    "a runner group open to any workflow": (lambda r: r.groups[0].workflows.clear(),
                                            "is open to more than dsv4-mi300x/bakery's .github/workflows/smoke.yml"),
    "a runner group open to another repository": (lambda r: r.groups[0].repositories.append("dsv4-mi300x/other"),
                                                  "is open to more than"),
    "a second runner group open to all": (lambda r: r.groups.append(stand_in.RunnerGroup("gpus", "all",
                                                                                         runners=[MI300X])),
                                          "the runner group 'gpus' with an MI300X runner is open to more than"),
    "a key also an organization secret on page 2": (_on_page_two, "BAKERY_SMOKE_SIGNING_KEY is also a repository "
                                                                  "(or organization) secret"),
    "the package linked elsewhere": (lambda r: setattr(r, "package", (SETTINGS.package, "someone/else")),
                                     "is linked to someone/else, not dsv4-mi300x/bakery"),
}


@pytest.mark.parametrize("case", sorted(SHORTFALLS))
def test_each_gap_is_one_line_saying_what_to_do(case, ready_project, gh):
    make, words = SHORTFALLS[case]
    make(gh.state.repo)
    found = gaps(ready_project, gh)
    assert len(found) == 1 and words in found[0], found
    what, _, fix = found[0].partition(": ")
    assert fix, found[0]  # what to do, after the gap itself


# each: a repository set up otherwise than ready_repo, still closed
CLOSED = {
    "every listing one item a page": lambda r: setattr(r, "page_size", 1),
    "the labels as GitHub spells its own": lambda r: r.groups[0].runners.__setitem__(
        0, ["self-hosted", "Linux", "X64", "mi300x"]),
    "organization admins and the Maintain role may bypass": lambda r: r.tag_rulesets[0].bypass_actors.extend(
        [{"actor_id": 1, "actor_type": "OrganizationAdmin", "bypass_mode": "always"},
         {"actor_id": 2, "actor_type": "RepositoryRole", "bypass_mode": "always"}]),
    "the Write role bypasses on pull requests only": lambda r: r.tag_rulesets[0].bypass_actors.append(
        {**WRITE_ROLE, "bypass_mode": "pull_request"}),
    "other tags excluded": lambda r: r.tag_rulesets[0].exclude.append("refs/tags/nightly-*"),
    "a flawed ruleset beside a sound one": lambda r: r.tag_rulesets.insert(0, stand_in.Ruleset(
        ["~ALL"], enforcement="evaluate")),
    "main protected as the default branch": lambda r: setattr(r.branch_rulesets[0], "include", ["~DEFAULT_BRANCH"]),
    "a runner group of another runner open to all": lambda r: r.groups.append(stand_in.RunnerGroup(
        "cpus", "all", runners=[["self-hosted", "linux", "x64"]])),
}


@pytest.mark.parametrize("case", sorted(CLOSED))
def test_what_leaves_nothing_open_is_no_gap(case, ready_project, gh):
    CLOSED[case](gh.state.repo)
    assert gaps(ready_project, gh) == []


def test_a_next_page_off_the_api_is_refused(gh):
    """The token goes with each page asked for: never to a host a Link header names."""
    client = github.GitHub(TOKEN, gh.api)
    page_two = f"{gh.api}/repositories/1/x?page=2"  # GitHub's own links may name a repository by its id
    assert client._next_page(f'<{page_two}>; rel="next", <{gh.api}/repositories/1/x?page=3>; rel="last"', "/x") == page_two
    with pytest.raises(RegistryError, match="links its next page to 'https://elsewhere.example/x.page=2', outside"):
        client._next_page('<https://elsewhere.example/x?page=2>; rel="next"', "/x")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["no token", "no network"])
def test_without_the_api_the_checkouts_own_gaps_come_first(case):
    """The lock made for the fixture and no mirror are seen in the checkout: named, each a missing:
    line, before the one line saying why GitHub could not be asked."""
    env = {"GITHUB_TOKEN": "", "GH_TOKEN": ""} if case == "no token" else {"GITHUB_TOKEN": TOKEN, "GH_TOKEN": ""}
    result = invoke(ROOT, "preflight", "--repository", f"{OWNER}/{NAME}", "--api",
                    f"https://127.0.0.1:{_closed_port()}/api/v3", env=env)
    code, words = (InputError.exit_code, "no GitHub token") if case == "no token" else \
        (RegistryError.exit_code, "did not answer GET")
    assert result.returncode == code, result
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("missing: overlays/overlays.lock was made for") and \
        lines[1].startswith("missing: image/base.yaml names no mirror"), result.stdout
    assert result.stderr.count("error:") == 1 and words in result.stderr, result.stderr


def test_gaps_exit_with_their_code_and_a_bad_token_is_one_line(ready_project, gh):
    gh.state.repo.groups[0].runners.clear()
    gh.state.repo.tag_rulesets.clear()
    result = invoke(ready_project, "preflight", "--repository", f"{OWNER}/{NAME}", "--api", gh.api,
                    env={"GITHUB_TOKEN": TOKEN})
    assert result.returncode == github.NOT_READY
    assert [line for line in result.stdout.splitlines() if line.startswith("missing: ")] == \
        [f"missing: {g}" for g in gaps(ready_project, gh)] and len(result.stdout.splitlines()) == 2
    denied = invoke(ready_project, "preflight", "--repository", f"{OWNER}/{NAME}", "--api", gh.api,
                    env={"GITHUB_TOKEN": "wrong"})
    assert denied.returncode == AuthError.exit_code and denied.stderr.count("error:") == 1, denied.stderr


def test_a_workflow_naming_a_secret_outside_its_scope_stops_preflight(ready_project, gh, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(ready_project, project)
    settings = project / settings_mod.SETTINGS
    doc = yaml.safe_load(settings.read_text())
    doc["environments"]["release"]["variables"] = list(doc["repository"]["variables"])
    doc["repository"]["variables"] = {}
    settings.write_text(yaml.safe_dump(doc))
    result = invoke(project, "preflight", "--repository", f"{OWNER}/{NAME}", "--api", gh.api,
                    env={"GITHUB_TOKEN": TOKEN})
    assert result.returncode == 2 and "release.yml: job promote (no environment) reads vars.BAKERY_" in result.stderr


# -- the MI300X runner's watch ----------------------------------------------------------------------

def watch(gh, statuses: list, minutes: float = 0.002):
    """await_runner against the stand-in, the smoke job's status taken from `statuses` one poll at a
    time (the last one repeats)."""
    seen: list = []

    def jobs():
        status = statuses[min(len(seen), len(statuses) - 1)]
        seen.append(status)
        return [] if status is None else [{"name": "smoke on MI300X", "status": status},
                                          {"name": "promote", "status": "queued"}]

    gh.state.run_jobs = jobs
    return github.await_runner(github.GitHub(TOKEN, gh.api), f"{OWNER}/{NAME}", "77", "smoke on MI300X", minutes,
                               log=lambda m: None, poll=0.01, review_minutes=0.01)


def test_a_job_a_runner_takes_is_let_be(gh):
    assert watch(gh, [None, "waiting", "queued", "in_progress"]) == "in_progress"
    assert gh.state.cancelled == []


def test_a_job_no_runner_takes_cancels_the_run_in_time(gh):
    with pytest.raises(EnvironmentProblem, match=r"no runner took 'smoke on MI300X' within 0.002 minutes .* the run is "
                                                 r"cancelled. Register the MI300X runner"):
        watch(gh, ["queued"])
    assert gh.state.cancelled == ["77"]


def test_waiting_for_reviewers_is_not_waiting_for_a_runner(gh):
    """A job its environment's reviewers have not approved asks for no runner yet: never cancelled for that."""
    assert watch(gh, ["waiting"], minutes=0.0001) == "waiting"
    assert gh.state.cancelled == []


def test_the_task_fails_with_an_annotation(gh, tmp_path):
    gh.state.run_jobs = lambda: [{"name": "smoke on MI300X", "status": "queued"}]
    result = invoke(ROOT, "await-runner", "--job", "smoke on MI300X", "--minutes", "0.005",
                    env={"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": gh.api, "GITHUB_RUN_ID": "91",
                         "GITHUB_REPOSITORY": f"{OWNER}/{NAME}", "BAKERY_POLL_SECONDS": "0.05"})
    assert result.returncode == EnvironmentProblem.exit_code, result.stderr
    assert result.stdout.startswith("::error title=No runner took smoke on MI300X::no runner took")
    assert result.stderr.count("error:") == 1 and gh.state.cancelled == ["91"]


def test_public_keys_in_an_environment_would_reach_four_jobs_empty():
    """Where the public keys live, enforced: kept beside their secrets, build, rebuild, attach-smoke
    and promote (no environment) would read them empty; the committed settings pass."""
    workflows = {name: yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
                 for name in ("release.yml", "build-and-sign.yml", "rebuild.yml", "smoke.yml")}
    assert [p for name, wf in workflows.items() for p in settings_mod.unscoped(wf, SETTINGS, name)] == []
    moved = dataclasses.replace(SETTINGS, variables={}, environments={
        **SETTINGS.environments,
        "release": dataclasses.replace(SETTINGS.environments["release"], variables=tuple(SETTINGS.variables))})
    problems = [p for name, wf in workflows.items() for p in settings_mod.unscoped(wf, moved, name)]
    jobs = {p.split("job ")[1].split(" ")[0] for p in problems}
    assert {"build", "rebuild", "attach-smoke", "promote"} <= jobs
    assert "sign" not in jobs  # in the release environment itself, it would see them


def test_a_secret_read_by_an_expression_cannot_be_checked():
    workflow = {"jobs": {"x": {"steps": [{"run": "echo ${{ secrets[format('{0}', 'K')] }}"}]},
                         "y": {"steps": [{"run": "echo ${{ toJSON(vars) }}"}]}}}
    problems = settings_mod.unscoped(workflow, SETTINGS, "w.yml")
    assert len(problems) == 2 and all("by an expression the check cannot follow" in p for p in problems)


@pytest.mark.parametrize("text", ["${{ format('}}{0}', secrets.BAKERY_SIGNING_KEY) }}", "${{ SECRETS.bakery_signing_key }}",
                                  "${{ Secrets . BAKERY_SIGNING_KEY }}"])
def test_a_secret_is_found_however_it_is_spelled(text):
    """GitHub reads context and property names without regard to case, and a `}}` in a string does
    not end an expression."""
    workflow = {"jobs": {"build": {"steps": [{"run": "x", "env": {"K": text}}]}}}
    problems = settings_mod.unscoped(workflow, SETTINGS, "w.yml")
    assert len(problems) == 1 and "reads secrets.BAKERY_SIGNING_KEY" in problems[0], problems


def test_a_string_that_merely_says_secrets_is_not_a_reference():
    workflow = {"jobs": {"build": {"steps": [{"run": "x", "env": {"K": "${{ format('secrets.{0}', 'X') }}"}}]}}}
    assert settings_mod.unscoped(workflow, SETTINGS, "w.yml") == []
