"""Someone else's text (the base's file names and METADATA, a proof's output, an upstream tag) made
safe for where it goes. One function, one rule per sink:

- every sink: at most `limit` characters (the rest counted, not kept); control characters, line
  and paragraph separators, the bidirectional overrides that can hide or reorder a line, invisible
  and tag characters and lone surrogates are shown escaped (\\x1b, \\u202e), never acted on;
- "terminal" and "json" stop there (JSON escapes the rest itself; what a verifier later prints of
  a signed record is already inert);
- "markdown" (a PR or issue body, a table cell) also escapes Markdown and HTML, and breaks every
  mention and issue reference (#1, GH-1, o/r#1), URL-shaped ones included: GitHub closes an issue on merge for a
  `fixes #1` or a `fixes https://github.com/o/r/issues/1` in a PR body.
"""

from __future__ import annotations

import re

SINKS = ("terminal", "json", "markdown")
# controls (C0, DEL, C1), separators, bidirectional marks and overrides, invisible and zero-width
# characters, the byte order mark, tag characters, and lone surrogates (a file name's undecodable bytes)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                     "\u3164\ufeff\ufff9-\ufffb\U000e0000-\U000e007f\ud800-\udfff]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()+!|~&])")
_REFERENCE = re.compile(r"([@#])(?=\w)|(?i:\b(gh))(-)(?=\d)")
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*):(//)")
_WWW = re.compile(r"(?i)\b(www)(\.)")
WORD_JOINER = "\u2060"  # invisible, and no link, mention or reference matches across it


def _escape(match: re.Match) -> str:
    code = ord(match.group())
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
    text = _UNSAFE.sub(lambda m: m.group() if lines and m.group() == "\n" else _escape(m), text)
    if sink == "markdown":
        text = _MARKDOWN.sub(r"\\\1", text)
        text = _REFERENCE.sub(_break, text)
        text = _URL.sub("\\1:" + WORD_JOINER + "\\2", text)
        text = _WWW.sub("\\1" + WORD_JOINER + "\\2", text)
    return text
