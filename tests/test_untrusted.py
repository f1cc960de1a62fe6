"""untrusted.safe: someone else's text, inert wherever it is printed (a terminal, JSON, Markdown, and
the log of GitHub's runner, which acts on workflow commands in it)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_text_of_someone_else_starts_a_line_with_a_runner_command():
    """On GitHub a line that starts with :: is a workflow command (::add-mask::, ::error::,
    ::stop-commands::): a base's compiler output or file name kept in an error line must not be one."""
    from bakery.untrusted import safe

    shown = safe("compiling\n::add-mask::ghp_token\n  ::error file=x::forged\nfine::here", lines=True)
    assert not any(line.lstrip().startswith("::") for line in shown.splitlines()), shown
    assert "fine::here" in shown and "add-mask" in shown  # the text is still there, inert
    assert not safe("::set-output name=image::evil").startswith("::")


def test_an_envelope_of_thousands_of_signatures_is_refused_before_one_is_tried():
    import base64
    import json

    import pytest

    from bakery.errors import IntegrityError
    from bakery.trust import sign

    def envelope(n: int) -> bytes:
        return json.dumps({"payload": base64.b64encode(b"{}").decode(), "payloadType": sign.IN_TOTO,
                           "signatures": [{"keyid": "", "sig": "AAAA"}] * n}).encode()

    with pytest.raises(IntegrityError, match="holds 5000 signatures, past the 16"):
        sign.read_envelope(envelope(5000), "att")
    assert len(sign.read_envelope(envelope(16), "att")[2]) == 16


# -- GitHub's runner: its own rules, written out again here, apart from untrusted.py ---------------------
# actions/runner (src/Runner.Common/ActionCommand.cs): TryParseV2 acts on a line that, after .NET's
# String.TrimStart() (every char.IsWhiteSpace character: the Zs, Zl and Zp categories, \t to \r and
# U+0085), starts with "::"; TryParse, the legacy form, on "##[" anywhere in the line. A line is what
# StreamReader.ReadLine gives (src/Runner.Sdk/ProcessInvoker.cs): it ends at \r\n, \r or \n.

def _dotnet_white_space() -> set[str]:
    import sys
    import unicodedata

    return {chr(c) for c in range(sys.maxunicode + 1)
            if unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp")} | set("\t\n\v\f\r\x85")


RUNNER_WHITE_SPACE = "".join(sorted(_dotnet_white_space()))


def runner_commands(printed: str) -> list[str]:
    """The lines of printed that GitHub's runner would take for a workflow command."""
    import re

    return [line for line in re.split(r"\r\n|\r|\n", printed)
            if line.lstrip(RUNNER_WHITE_SPACE).startswith("::") or "##[" in line]


HOSTILE = [
    "\u00a0::error::forged",  # no-break space
    "\u3000::add-mask::ghp_token",  # ideographic space
    "\u2003::error file=x::forged",  # em space
    "\u1680\u202f\u205f\u2000\u200a ::warning::forged",
    "##[error]forged",
    "text ##[set-output name=a]b",
    "###[error]forged",
    "compiling\n\u3000::add-mask::ghp_token\nlinking",  # the second line carries it
    "first\nsecond ##[error]forged",
    "\x85::error::forged\u2028::error::forged\r::error::forged",  # trimmed by .NET, ends a line: escaped
]


def test_the_runners_white_space_is_what_untrusted_trims_before_a_command():
    import re

    from bakery.untrusted import DOTNET_WHITE_SPACE

    in_class = re.compile(f"[{DOTNET_WHITE_SPACE}]")
    assert {c for c in map(chr, range(0x110000)) if in_class.fullmatch(c)} == set(RUNNER_WHITE_SPACE)
    assert "\u00a0" in RUNNER_WHITE_SPACE and "\u3000" in RUNNER_WHITE_SPACE and "\ufeff" not in RUNNER_WHITE_SPACE


@pytest.mark.parametrize("text", HOSTILE, ids=ascii)
@pytest.mark.parametrize("sink", ["terminal", "json", "markdown"])
def test_no_form_of_a_runner_command_survives_safe(text, sink):
    """After Unicode white space (which .NET trims) as after none, at a line's start or mid-line (the
    legacy ##[), on one line or with line breaks kept: the runner finds no command, and the words stay."""
    from bakery.untrusted import safe

    assert runner_commands(text), "the hostile text itself must be a command to the runner"
    for lines in (False, True):
        shown = safe(text, sink, limit=1000, lines=lines)
        assert not runner_commands(shown), (sink, lines, shown)
        for word in ("forged", "ghp_token", "set-output"):
            kept = word.replace("_", "\\_") if sink == "markdown" else word
            assert (word in text) == (kept in shown), (word, shown)
        assert not runner_commands(safe(shown, limit=4000, lines=True))  # shown again, at the CLI's edge


def test_a_command_is_shown_with_its_colon_or_bracket_escaped():
    from bakery.untrusted import safe

    assert safe("\u3000::error::x") == "\u3000\\x3a:error::x"
    assert safe("a\n\u00a0::error::x", lines=True) == "a\n\u00a0\\x3a:error::x"
    assert safe("a ##[error]x") == "a ##\\x5berror]x"
    assert safe("#") + safe("#[error]x") == "##\\x5berror]x"  # a # before the text completes no ##[


def test_a_zero_width_character_is_no_white_space_to_the_runner():
    """.NET 8's TrimStart() keeps U+FEFF and U+200B (format characters, not White_Space), so they start
    no command; they are shown escaped all the same."""
    from bakery.untrusted import safe

    for text in ("\ufeff::error::forged", "\u200b::error::forged", "\u180e::error::forged"):
        assert not runner_commands(text)
        assert safe(text) == f"\\u{ord(text[0]):04x}::error::forged"


def test_text_that_is_no_command_is_left_as_it_was():
    from bakery.untrusted import safe

    for text in ("fine::here", "a :: b", "issue #12 [draft]", "## heading", "\u3000indented", "x: y:: z"):
        assert safe(text) == text


def _edge_message(error: BaseException) -> str:
    """What the CLI's one edge (cli/edge.py) prints for an error a task raised."""
    import gc

    from invoke import Exit

    from bakery.cli.edge import reports_errors_for

    def task(c):
        raise error

    try:
        with pytest.raises(Exit) as exited:
            reports_errors_for(ROOT)(task)(None)
    finally:
        gc.unfreeze()
    return str(exited.value.message)


HOSTILE_LINES = "\u3000::add-mask::ghp_token\nx.hip:1: error ##[error]forged\n\u00a0\u2003::error file=a::forged"


def test_verify_shows_an_unsigned_predicate_type_annotation_inert(tmp_path):
    """Source 1: a layer's predicateType annotation (anyone who can push chose it) is quoted in verify's
    failure line, as is the type the unsigned statement claims."""
    import base64
    import json
    from types import SimpleNamespace

    from bakery.cli import render
    from bakery.errors import IntegrityError
    from bakery.oci.refs import Digest, Reference
    from bakery.oci.store import LayoutStore, signature_tag
    from bakery.trust import sign, verify

    ref = Reference("registry.example", "bakery", None, Digest("sha256", "ab" * 32))
    store = LayoutStore(tmp_path, create=True)
    statement = {"predicateType": "https://slsa.dev/provenance/v1 ##[error]claimed", "predicate": {}, "subject": []}
    envelope = json.dumps({"payload": base64.b64encode(json.dumps(statement).encode()).decode(),
                           "payloadType": sign.IN_TOTO, "signatures": [{"keyid": "", "sig": "AAAA"}]}).encode()
    layer = store.put_blob(envelope, "application/vnd.dsse.envelope.v1+json").to_json()
    layer["annotations"] = {"predicateType": "https://slsa.dev/provenance/v1 ##[error]forged\n" + HOSTILE_LINES}
    config = store.put_blob(b"{}", "application/vnd.oci.image.config.v1+json").to_json()
    store.put_manifest(signature_tag(ref.pin, "att"), json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": config,
         "layers": [layer]}).encode())

    report = verify.Report()
    verify._attestations(store, ref, None, report)
    assert any("annotated" in what and "##[error]forged" in what for what in report.failures), report.checks
    shown = render.verified(SimpleNamespace(report=report))
    assert not runner_commands(shown), shown
    assert "forged" in shown and "claimed" in shown and "add-mask" in shown
    said = _edge_message(IntegrityError(f"verification failed: {'; '.join(report.failures)}"))
    assert not runner_commands(said), said


def test_a_hostile_toolchains_compile_failure_is_shown_inert(tmp_path, monkeypatch):
    """Source 2: the compiler's last lines, kept as lines in the error; a toolchain image is someone else's."""
    from bakery import broker_client
    from bakery.errors import EnvironmentProblem
    from bakery.inputs import hip, hip_compile
    from bakery.oci.refs import Reference

    monkeypatch.setenv(broker_client.SOCKET_ENV, str(tmp_path / "broker.sock"))
    monkeypatch.setattr(broker_client, "compile_outside", lambda toolchain, shell, out: (1, HOSTILE_LINES))
    with pytest.raises(EnvironmentProblem) as failed:
        hip_compile.run_toolchain(hip.load(ROOT / "hip"), Reference.parse("registry.example/toolchain@sha256:" + "cd" * 32), "make",
                                  tmp_path)
    assert runner_commands(str(failed.value))  # as raised: the compiler's words, unchanged
    said = _edge_message(failed.value)
    assert not runner_commands(said), said
    assert len(said.splitlines()) == 4 and "forged" in said and "add-mask" in said  # still its lines


def test_a_rebuilt_revisions_last_error_line_is_shown_inert(tmp_path, monkeypatch):
    """Source 3: the last line the revision's own code wrote on stderr, in the rebuild's failure."""
    import subprocess
    from contextlib import contextmanager

    from bakery.errors import EnvironmentProblem
    from bakery.release import reproduce

    @contextmanager
    def serve(folder, grant, problems):
        yield folder / "socket"

    (tmp_path / "source" / "hip").mkdir(parents=True)  # the clone git would have made
    monkeypatch.setattr(reproduce, "_git", lambda *args, **kwargs: "")
    monkeypatch.setattr(reproduce.broker, "serve", serve)
    monkeypatch.setattr(reproduce.sandbox, "run", lambda argv, *a, **k: subprocess.CompletedProcess(
        argv, 1, "", "building\n\u3000::error::forged ##[set-output name=a]b"))
    plan = reproduce.Plan("https://example.invalid/r.git", "ef" * 20, False,
                          "registry.example/base@sha256:" + "01" * 32, 0, None)
    with pytest.raises(EnvironmentProblem, match="the rebuild failed") as failed:
        reproduce.rebuild(plan, tmp_path, None, lambda line: None)
    assert runner_commands(str(failed.value))
    said = _edge_message(failed.value)
    assert not runner_commands(said), said
    assert "forged" in said and "set-output" in said
