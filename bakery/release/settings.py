"""What the workflows need of GitHub (.github/release-settings.yaml), typed, and which secrets and
variables each job of a workflow sees as GitHub scopes them.

GitHub gives a job with `environment: X` X's secrets and variables and the repository's, and a job
without one only the repository's; a name outside a job's scope is the empty string there, not an
error. act, which runs the rehearsals, gives every job everything. So a workflow is checked here, by
reading every expression of every job: each secret or variable it names must be in that job's scope.
Where that holds, act and GitHub give each job the same values; where it does not, the rehearsal
refuses to run and the tests fail, naming the job and the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError
from ..trust.policy import ROLES

SETTINGS = Path(".github") / "release-settings.yaml"
ALWAYS = frozenset({"GITHUB_TOKEN"})  # GitHub's own secret, in every job's scope
# release.yml and the role workflows it calls (each job's scope is its own environment's), the nightly
WORKFLOWS = ("release.yml", "build-and-sign.yml", "rebuild.yml", "smoke.yml", "nightly.yml")


@dataclass(frozen=True)
class Environment:
    """A GitHub environment a job names: its secrets and variables, and who may deploy to it: tags
    matching Settings.tags, through required reviewers; or, with `branch`, that branch alone and no
    reviewer (a scheduled job's, which nobody is there to approve)."""
    name: str
    secrets: tuple[str, ...]
    variables: tuple[str, ...] = ()
    branch: str | None = None


@dataclass(frozen=True)
class Settings:
    variables: dict[str, str]  # repository variable -> the role whose public key it holds
    optional_variables: tuple[str, ...]
    environments: dict[str, Environment]
    tags: str
    mi300x_labels: tuple[str, ...]
    package: str
    smoke_workflow: str = ".github/workflows/smoke.yml"  # the workflow whose job the MI300X runner takes

    def scope(self, environment: str | None) -> tuple[frozenset[str], frozenset[str]]:
        """(secrets, variables) a job in `environment` (None: no environment) is given."""
        variables = set(self.variables) | set(self.optional_variables)
        secrets = set(ALWAYS)
        if environment is not None:
            env = self.environments.get(environment)
            if env is not None:
                secrets |= set(env.secrets)
                variables |= set(env.variables)
        return frozenset(secrets), frozenset(variables)

    def where(self, kind: str, name: str) -> str:
        """Where a secret or variable lives, in words (for a message)."""
        if kind == "vars" and (name in self.variables or name in self.optional_variables):
            return "the repository's variables"
        homes = [e.name for e in self.environments.values() if name in (e.secrets if kind == "secrets" else e.variables)]
        return f"environment {', '.join(homes)}" if homes else "nowhere in .github/release-settings.yaml"


def load(path: Path) -> Settings:
    doc = schema.load_yaml(path, {"repository": dict, "environments": dict, "tags": str, "mi300x_labels": list,
                                  "package": str})
    repo = doc["repository"]
    schema.check_keys(repo, {"variables": dict, "optional_variables": list}, f"{path}: repository")
    variables = {}
    for name, spec in repo["variables"].items():
        if not isinstance(spec, dict) or spec.get("public_key") not in ROLES or set(spec) != {"public_key"}:
            raise InputError(f"{path}: repository.variables.{name} must be {{public_key: ROLE}}, ROLE one of "
                             f"{', '.join(ROLES)}")
        variables[str(name)] = spec["public_key"]
    environments = {}
    for name, spec in doc["environments"].items():
        if not isinstance(spec, dict):
            raise InputError(f"{path}: environments.{name} must be a mapping")
        schema.check_keys(spec, {"secrets": list, "variables": list, "branch": str}, f"{path}: environments.{name}",
                          required={"secrets"})
        if "branch" in spec and not re.fullmatch(r"[A-Za-z0-9._/-]+", spec["branch"]):
            raise InputError(f"{path}: environments.{name}.branch must be one branch's name, not a pattern")
        environments[str(name)] = Environment(str(name), _names(spec["secrets"], f"{path}: environments.{name}.secrets"),
                                              _names(spec.get("variables") or [], f"{path}: environments.{name}"),
                                              spec.get("branch"))
    return Settings(variables, _names(repo["optional_variables"], f"{path}: repository.optional_variables"),
                    environments, doc["tags"], _labels(doc["mi300x_labels"], f"{path}: mi300x_labels"), doc["package"])


def _labels(value: list, where: str) -> tuple[str, ...]:
    if not value or not all(isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", v) for v in value):
        raise InputError(f"{where} must be a list of runner labels")
    return tuple(value)


def _names(value: list, where: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) for v in value):
        raise InputError(f"{where} must be a list of secret or variable names")
    return tuple(value)


# -- what a workflow's jobs name -----------------------------------------------------------------------

NAMED = re.compile(r"\b(secrets|vars)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)", re.I)
CONTEXT = re.compile(r"(?<![\w.-])(secrets|vars)\b", re.I)
STRING = re.compile(r"'(?:[^']|'')*'")  # an expression's string literal ('' is a quote inside it)


def _braced(text: str):
    """What each `${{ ... }}` of a string holds, a `}}` inside a quoted string not ending it."""
    at = 0
    while (start := text.find("${{", at)) >= 0:
        i, quoted = start + 3, False
        while i < len(text):
            if text[i] == "'":
                quoted = not quoted  # '' inside a string reads as leaving and entering it again: the same
            elif not quoted and text.startswith("}}", i):
                break
            i += 1
        yield text[start + 3:i]
        at = i + 2


def _expressions(node, key: str | None = None):
    """Every expression in a workflow node: what `${{ }}` holds, and an `if:`'s whole text."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _expressions(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _expressions(v)
    elif isinstance(node, str):
        found = list(_braced(node))
        if key == "if" and not found:
            found = [node]
        yield from found


def references(node) -> tuple[set[tuple[str, str]], list[str]]:
    """({(secrets|vars, NAME)} a node names, [expressions that reach the contexts another way:
    secrets[...], toJSON(vars), ...], which no check can bound). Context and property names are
    matched as GitHub matches them, without regard to case; string literals are not code."""
    named, dynamic = set(), []
    for expression in _expressions(node):
        code = STRING.sub("''", expression)
        found = [(kind.lower(), name.upper()) for kind, name in NAMED.findall(code)]
        named.update(found)
        if len(CONTEXT.findall(code)) > len(found):
            dynamic.append(expression.strip())
    return named, dynamic


def unscoped(workflow: dict, settings: Settings, name: str) -> list[str]:
    """Each secret or variable a job of `workflow` names that GitHub would give it empty, as a line
    naming the job, the name and where it lives; and each expression that reaches them another way."""
    problems = []
    outside = {k: v for k, v in workflow.items() if k != "jobs"}  # workflow-level env and defaults: every job's
    for job_id, job in (workflow.get("jobs") or {}).items():
        environment = job.get("environment")
        if isinstance(environment, dict):
            environment = environment.get("name")
        if environment is not None and (not isinstance(environment, str) or "${{" in environment):
            problems.append(f"{name}: job {job_id} names its environment by an expression ({environment!r}): its "
                            f"scope cannot be checked")
            continue
        secrets, variables = settings.scope(environment)
        named, dynamic = references([outside, job])
        for expression in dynamic:
            problems.append(f"{name}: job {job_id} reads its secrets or variables by an expression the check cannot "
                            f"follow: ${{{{ {expression[:80]} }}}}")
        for kind, ref in sorted(named):
            if ref not in {n.upper() for n in (secrets if kind == "secrets" else variables)}:
                has = f"environment {environment}" if environment else "no environment"
                problems.append(f"{name}: job {job_id} ({has}) reads {kind}.{ref}, which lives in "
                                f"{settings.where(kind, ref)}: on GitHub it would be empty there")
    return problems


def check_workflows(project: Path, paths=None) -> Settings:
    """The settings, once every job of each workflow (default: WORKFLOWS) names only what its scope
    holds (InputError naming the first that does not)."""
    import yaml

    settings = load(project / SETTINGS)
    problems = []
    for path in paths or [project / ".github" / "workflows" / n for n in WORKFLOWS]:
        problems += unscoped(yaml.safe_load(Path(path).read_text()), settings, Path(path).name)
    if problems:
        raise InputError(f"{problems[0]} ({len(problems)} such problem(s); .github/release-settings.yaml says "
                         f"where each secret and variable lives)")
    return settings


def given(settings: Settings, variables: dict, secrets: dict) -> None:
    """What a rehearsal gives act: every name one that GitHub would hold somewhere (act gives every
    job all of them; the workflows' scopes were checked first, so no job reads one it would not get)."""
    known_vars = set(settings.variables) | set(settings.optional_variables) | \
        {v for e in settings.environments.values() for v in e.variables}
    known_secrets = set(ALWAYS) | {s for e in settings.environments.values() for s in e.secrets}
    for kind, names, known in (("variable", variables, known_vars), ("secret", secrets, known_secrets)):
        unknown = sorted(set(names) - known)
        if unknown:
            raise InputError(f"the rehearsal gives the {kind} {unknown[0]}, which .github/release-settings.yaml does "
                             f"not place anywhere: on GitHub no job would see it")
