"""The documentation against the code: every `invoke TASK --flag` that README.md and docs/*.md show
(in code blocks and in inline code) names a task tasks.py defines and flags that task takes, as
`invoke --help TASK` shows them; every relative link points to a file that exists (and a heading
that exists, where it names one).

The tasks' flags are read from invoke's own parser contexts for tasks.py's collection (what
`invoke --help TASK` prints, underscores turned into dashes, short flags and `--no-` included), so
nothing here restates a flag by hand."""

from __future__ import annotations

import importlib.util
import os
import re
from functools import cache
from pathlib import Path

import pytest
from invoke import Collection, Program
from invoke.parser import ParserContext

from support import ROOT, invoke

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")
SEPARATOR = re.compile(r"\s(?:&&|\|\||\||;)\s")


@cache
def contexts() -> dict[str, ParserContext]:
    """Each task's parser context by name and alias, as invoke builds them for `invoke --help TASK`."""
    spec = importlib.util.spec_from_file_location("tasks_for_docs", ROOT / "tasks.py")
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    by_name: dict[str, ParserContext] = {}
    for ctx in Collection.from_module(module).to_contexts():
        assert ctx.name is not None  # a task's context is named
        for name in (ctx.name, *ctx.aliases):
            by_name[name] = ctx
    return by_name


@cache
def core() -> ParserContext:
    """invoke's own options (`--list`, `--help [TASK]`, ...), given before any task."""
    return ParserContext(args=Program().core_args())


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token not in ("-", "--") and not token.startswith("->")


def _flag(token: str) -> str:
    return token.split("=", 1)[0]


def commands(text: str) -> list[str]:
    """Every piece of shell in the text that runs invoke: code blocks a line at a time (a line
    ending in a backslash, or followed by an indented one, goes on), then the inline code."""
    found = []
    for block in FENCE.findall(text):
        lines: list[str] = []
        for line in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # a shell comment
            if lines and (lines[-1].endswith("\\") or (line[:1].isspace() and line.strip())):
                lines[-1] = lines[-1].rstrip("\\") + " " + line.strip()
            else:
                lines.append(line)
        found += lines
    found += [span.replace("\\|", "|") for span in SPAN.findall(FENCE.sub("", text))]
    return [part for piece in found for part in SEPARATOR.split(piece) if re.search(r"(^|[\s/])invoke(\s|$)", part)]


def problems(command: str) -> list[str]:
    """What in one shown command invoke would not take: an unknown task, or a flag the task (or,
    before it, invoke itself) does not have. Placeholders (TASK) and values are left alone."""
    tokens = re.sub(r"[\[\]]", " ", command).split()
    start = next(i for i, t in enumerate(tokens) if t == "invoke" or t.endswith("/invoke"))
    rest, wrong = tokens[start + 1:], []
    while rest and _is_flag(rest[0]):  # invoke's own options
        flag = _flag(rest.pop(0))
        if flag not in core().flags:
            wrong.append(f"invoke has no option {flag}")
        elif flag in ("--help", "-h") and rest and not _is_flag(rest[0]):
            name = rest.pop(0)
            if not name.isupper() and name not in contexts():
                wrong.append(f"no task {name!r}")
    if not rest or rest[0].isupper() or rest[0] == "...":
        return wrong  # `invoke --list`, `invoke TASK`, or the task left out
    name, args = rest[0], rest[1:]
    if name not in contexts():
        return wrong + [f"no task {name!r}"]
    ctx = contexts()[name]
    for token in filter(_is_flag, args):
        flag = _flag(token)
        if flag not in ctx.flags and flag not in ctx.inverse_flags and flag not in ("--help", "-h"):
            wrong.append(f"invoke {name} has no flag {flag}")
    return wrong


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(h) for h in re.findall(r"^#+\s+(.+?)\s*$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    wrong = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            wrong.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            wrong.append(f"{target}: no such heading in {os.path.relpath(where, path.parent)}")
    return wrong


# -- the documentation as it stands ----------------------------------------------------------------

def test_the_pages_are_there_and_show_commands():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/architecture.md", "docs/fixture.md", "docs/ops.md", "docs/release.md",
            "docs/security.md"} <= names
    shown = [c for p in DOCS for c in commands(p.read_text())]
    assert len(shown) > 50 and any("invoke verify" in c for c in shown)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_invoke_command_shown_exists_with_the_flags_it_gives(page):
    wrong = [f"{problem}, in: {c}" for c in commands(page.read_text()) for problem in problems(c)]
    assert wrong == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file_that_exists(page):
    assert broken_links(page) == []


def test_readme_links_each_page_under_docs():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in DOCS[1:] if f"](docs/{p.name})" not in readme] == []


# -- the checks themselves catch what they are for --------------------------------------------------

def test_a_made_up_flag_or_task_is_caught():
    text = ("Run `invoke verify IMAGE --key release.pub --require-smok` first.\n\n"
            "```sh\n"
            "BAKERY_KEY_PASSWORD=... .venv/bin/invoke keygen --role release --out keys/   # fine\n"
            "invoke build --push REPO \\\n"
            "    --sign-with keys/release.key\n"
            "invoke build [--base REF@sha256:...]\n"
            "             [--tag v1]\n"
            "scripts/bootstrap.sh && .venv/bin/invoke deploi\n"
            "invoke --help frobnicate\n"
            "```\n")
    found = {c: problems(c) for c in commands(text)}
    assert sorted(w for ws in found.values() for w in ws) == [
        "invoke build has no flag --sign-with", "invoke build has no flag --tag",
        "invoke verify has no flag --require-smok", "no task 'deploi'", "no task 'frobnicate'"]


def test_dashes_short_flags_and_negations_are_invokes_own():
    assert problems("invoke attest-rebuild IMAGE --outcome F --release-key R --key K") == []
    assert problems("invoke track --from X --mirror Y --no-bump --list") == []
    assert problems("invoke build -b REF -p REPO") == []
    assert problems("invoke test -k name -x --fast") == []
    assert problems("invoke --list") == [] and problems("invoke --help TASK") == []
    assert problems("invoke attest_rebuild IMAGE") == ["no task 'attest_rebuild'"]
    assert problems("invoke deploy --proxy_image X") == ["invoke deploy has no flag --proxy_image"]
    assert problems("invoke --lsit") == ["invoke has no option --lsit"]


def test_a_link_to_a_missing_file_or_heading_is_caught(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## What a build does\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md) [ok](a.md#what-a-build-does) [web](https://example.com/x) "
                    "[gone](missing.md) [bad](a.md#nowhere)\n")
    assert broken_links(page) == ["missing.md: no such file", "a.md#nowhere: no such heading in a.md"]


@pytest.mark.slow
def test_the_flags_read_here_are_the_ones_invoke_help_prints():
    """The parser contexts this file reads are what `invoke --help TASK` shows (one task, a subprocess)."""
    for name in ("deploy", "track"):
        printed = set()
        for line in invoke(ROOT, "--help", name).stdout.split("Options:", 1)[1].splitlines():
            if line.startswith("  -"):  # the options column: `-b STRING, --base=STRING`, `--[no-]bump`
                for shown in re.split(r"\s{2,}", line.strip())[0].split(", "):
                    flag = shown.split("=")[0].split()[0]
                    printed |= {flag.replace("[no-]", ""), flag.replace("[no-]", "no-")}
        ctx = contexts()[name]
        assert printed == set(ctx.flags) | set(ctx.flags.aliases) | set(ctx.inverse_flags), name
