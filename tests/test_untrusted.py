

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
