"""Strict reading of checked-in YAML: unknown keys and wrong types are errors, not warnings."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .errors import InputError

YAML_LIMIT = 4 << 20  # a checked-in YAML file is kilobytes


def load_yaml(path: Path, schema: dict, required: set | None = None) -> dict:
    """Load a YAML mapping and check it against {key: type}; every key is required unless listed.
    Read as a regular file of at most YAML_LIMIT bytes, never through a link at its name (a
    rebuilt revision's recipe is read outside its sandbox: a link to /dev/zero, a FIFO)."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > YAML_LIMIT:
                raise InputError(f"{path}: not a regular file of at most {YAML_LIMIT} bytes")
            text = f.read(YAML_LIMIT + 1).decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml when there
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where else ""
        raise InputError(f"{path}:{line} is not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping at the top level")
    check_keys(data, schema, str(path), required)
    return data


def check_keys(data: dict, schema: dict, where: str, required: set | None = None) -> None:
    unknown = sorted(set(data) - set(schema))
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; "
                         f"allowed: {', '.join(sorted(schema))}")
    needed = set(schema) if required is None else required
    missing = sorted(needed - set(data))
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
    for key, value in data.items():
        expected = schema[key]
        if value is not None and not isinstance(value, expected):
            name = expected.__name__ if isinstance(expected, type) else "/".join(t.__name__ for t in expected)
            raise InputError(f"{where}: {key} must be a {name}, got {type(value).__name__}")


def load_json(path: Path, schema: str, what: str, remedy: str) -> dict:
    """Read a JSON document we generated; say what to run when it is missing, broken or foreign."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{what} {path} not found: {remedy}") from None
    except (ValueError, OSError) as e:
        raise InputError(f"{what} {path} is not readable JSON ({e}): {remedy}") from None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        found = doc.get("schema") if isinstance(doc, dict) else None
        raise InputError(f"{path} is not a {what} (schema {found!r}): {remedy}")
    return doc


def file_inside(folder: Path, name: str, where: str) -> Path:
    """folder/name, a regular file that is really inside folder: not absolute, no '..', no link
    out of it (an absolute src would bake any file of the building host)."""
    path = folder / name
    if Path(name).is_absolute() or ".." in Path(name).parts or not path.is_file() or \
            not path.resolve().is_relative_to(folder.resolve()):
        raise InputError(f"{where}: {name!r} is not a file inside {folder} (absolute, '..' or a link out of it?)")
    return path
