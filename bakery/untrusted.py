"""Someone else's text (the base's file names and METADATA, a proof's output, an upstream tag) made
safe for where it goes. One function, one rule per sink:

- every sink: at most `limit` characters (the rest counted, not kept); control characters, line
  and paragraph separators, the bidirectional overrides that can hide or reorder a line, invisible
  and tag characters and lone surrogates are shown escaped (\\x1b, \\u202e), never acted on,
  and no line is a command to GitHub's runner (a :: that starts it after any white space .NET trims,
  a ##[ anywhere: the first : shown as \\x3a, the [ as \\x5b);
- "terminal" and "json" stop there (JSON escapes the rest itself; what a verifier later prints of
  a signed record is already inert);
- "markdown" (a PR or issue body, a table cell) also escapes Markdown and HTML, and breaks every
  mention and issue reference (#1, GH-1, o/r#1), URL-shaped ones included: GitHub closes an issue on merge for a
  `fixes #1` or a `fixes https://github.com/o/r/issues/1` in a PR body.
"""

from __future__ import annotations

import re
import unicodedata

SINKS = ("terminal", "json", "markdown")
# shown escaped: every control (Cc), format (Cf: bidi marks and overrides, zero-width, tags),
# surrogate (Cs: a file name's undecodable bytes), private-use (Co), unassigned (Cn) and line or
# paragraph separator (Zl, Zp) character, and the invisible ones of other categories (fillers,
# variation selectors, the combining grapheme joiner, Mongolian selectors, Khmer inherent vowels)
UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
INVISIBLE = set("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u3164\uffa0") | \
    {chr(c) for c in (*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0))}


def _unsafe(char: str) -> bool:
    return char in INVISIBLE or unicodedata.category(char) in UNSAFE_CATEGORIES


_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()+!|~&])")
_REFERENCE = re.compile(r"([@#])(?=\w)|(?i:\b(gh))(-)(?=\d)")
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*):(//)")
_WWW = re.compile(r"(?i)\b(www)(\.)")
WORD_JOINER = "\u2060"  # invisible, and no link, mention or reference matches across it


# GitHub's runner (actions/runner, .NET 8) acts on a line of a step's output in two forms; both are made
# inert on every sink, in the text as it will be printed (after safe's escaping, so the only white
# space left raw is the space, the other Zs characters and, with lines=True, \n):
# - a line is what StreamReader.ReadLine gives (src/Runner.Sdk/ProcessInvoker.cs, StartReadStream): it
#   ends at \n, \r or \r\n. OutputManager.OnDataReceived (src/Runner.Worker/Handlers/OutputManager.cs)
#   hands it to ActionCommandManager.TryProcessCommand (src/Runner.Worker/ActionCommandManager.cs),
#   which tries ActionCommand.TryParseV2, then ActionCommand.TryParse (src/Runner.Common/ActionCommand.cs);
# - TryParseV2: the line after String.TrimStart() starts with "::". TrimStart() drops every
#   char.IsWhiteSpace character, U+00A0, U+1680, U+2000-U+200A, U+202F, U+205F and U+3000 too (not
#   U+200B or U+FEFF, format characters, shown escaped here anyway);
# - TryParse, the legacy form: "##[" anywhere in the line (IndexOf), whatever precedes it.
# Both find the key with a culture-sensitive StartsWith/IndexOf (ICU, which passes over ignorable
# characters such as U+0640 or a combining mark), but read the command's name at a fixed offset (2, or
# 3 past "##["): an ignorable character within the key, or before a leading "::", shifts the name off,
# so only the literal "::" and "##[" act.
# what char.IsWhiteSpace is true of, as a regular expression class
DOTNET_WHITE_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_COMMAND = re.compile(rf"^([{DOTNET_WHITE_SPACE}]*):(?=:)", re.MULTILINE)  # a line's first colon of a leading ::
_LEGACY_COMMAND = re.compile(r"(?<=#)\[")  # the [ of ##[ (and of #[, which a # before the text would complete)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _break(match: re.Match) -> str:
    """A word joiner after a mention's @ or a reference's #, or inside GH-1: nothing links across it."""
    if match.group(1):
        return match.group(1) + WORD_JOINER
    return match.group(2) + WORD_JOINER + match.group(3)


def safe(text, sink: str = "terminal", limit: int = 300, lines: bool = False) -> str:
    """text for sink; lines=True keeps its line breaks (a multi-line message on a terminal)."""
    if sink not in SINKS:
        raise ValueError(f"unknown sink {sink!r}")
    text = str(text)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    text = "".join(_escape(c) if _unsafe(c) and not (lines and c == "\n") else c for c in text)
    # no command to GitHub's runner (::add-mask::, ::error::, ##[error]), wherever it is printed (its rules:
    # above _COMMAND)
    text = _COMMAND.sub(lambda m: m.group(1) + "\\x3a", text)
    text = _LEGACY_COMMAND.sub(lambda m: "\\x5b", text)
    if sink == "markdown":
        text = _MARKDOWN.sub(r"\\\1", text)
        text = _REFERENCE.sub(_break, text)
        text = _URL.sub("\\1:" + WORD_JOINER + "\\2", text)
        text = _WWW.sub("\\1" + WORD_JOINER + "\\2", text)
    return text
