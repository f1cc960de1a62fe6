

def test_no_text_of_someone_else_starts_a_line_with_a_runner_command():
    """On GitHub a line that starts with :: is a workflow command (::add-mask::, ::error::,
    ::stop-commands::): a base's compiler output or file name kept in an error line must not be one."""
    from bakery.untrusted import safe

    shown = safe("compiling\n::add-mask::ghp_token\n  ::error file=x::forged\nfine::here", lines=True)
    assert not any(line.lstrip().startswith("::") for line in shown.splitlines()), shown
    assert "fine::here" in shown and "add-mask" in shown  # the text is still there, inert
    assert not safe("::set-output name=image::evil").startswith("::")
