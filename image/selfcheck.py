#!/usr/bin/env python3
"""Refuse to start unless every file baked by bakery still has the sha256 it was built with.

A bind mount over an overlay target, a stray edit or a missing file all change what runs while
/health would still say 200; this turns them into a clear failure before vLLM starts.
"""
import hashlib
import json
import sys

MANIFEST = "/etc/bakery/manifest.json"


def main() -> int:
    try:
        with open(MANIFEST, encoding="utf-8") as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError) as e:
        print(f"bakery-selfcheck: cannot read {MANIFEST}: {e}; this is not a bakery image", file=sys.stderr)
        return 1
    bad = []
    for path, expected in sorted(files.items()):
        try:
            with open(path, "rb") as f:
                found = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            found = f"unreadable ({e.strerror})"
        if found != expected:
            bad.append(f"{path}: expected sha256 {expected}, found {found}")
    if bad:
        for line in bad:
            print(f"bakery-selfcheck: {line}", file=sys.stderr)
        print(f"bakery-selfcheck: {len(bad)} of {len(files)} baked files differ from the signed build; "
              f"refusing to start. Remove bind mounts over image files and run the image unmodified.",
              file=sys.stderr)
        return 1
    print(f"bakery-selfcheck: {len(files)} baked files verified", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
