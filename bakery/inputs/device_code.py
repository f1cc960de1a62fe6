"""Device code checked without a GPU: a compiled extension's .hip_fatbin offload bundle read as
ELF, each AMDGPU code object for the recipe's arch and carrying the recipe's kernels. Pure: bytes in,
what was found (or IntegrityError) out."""

from __future__ import annotations

import struct

from .. import untrusted
from ..errors import IntegrityError

# EF_AMDGPU_MACH values (LLVM's ELF.h) of the archs a recipe may name.
ARCHS = {"gfx90a": 0x3F, "gfx940": 0x40, "gfx941": 0x4B, "gfx942": 0x4C, "gfx950": 0x4F}
EM_AMDGPU = 224
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
# UnicodeDecodeError is a ValueError; OverflowError: an offset past what struct can index (2^63)
MALFORMED = (struct.error, IndexError, ValueError, OverflowError)
# symbols a library's tables may hold together, every table of every code object counted (one may
# alias another's bytes): a HIP extension names a few thousand; each is compared in a Python loop
SYMBOLS_MAX = 1 << 20
HIP_OBJECTS_MAX = 16  # device code objects in one bundle: one an arch (the recipe names one)
SYMBOL_TABLES = ((".symtab", ".strtab"), (".dynsym", ".dynstr"))


def _sections(elf: bytes, wanted: tuple[str, ...]) -> dict[str, tuple[int, int, int, int]]:
    """{name: (type, offset, size, link)} of the wanted sections of an ELF64 little-endian file, each
    inside the file. Names are compared where they stand, none copied out: a string table without
    terminators, named by every header, costs no memory (a hostile toolchain's output is read here,
    outside the sandbox)."""
    if elf[:4] != b"\x7fELF" or elf[4:6] != b"\x02\x01":
        raise IntegrityError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize < 64:
        raise IntegrityError(f"an ELF section header of {shentsize} bytes (64 is the format's)")

    def header(i: int) -> tuple:
        return struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)

    names_at, names_size = header(shstrndx)[4:6]
    _inside(elf, names_at, names_size, "the section names")
    targets = {w: w.encode() + b"\0" for w in wanted}
    out: dict[str, tuple[int, int, int, int]] = {}
    for i in range(shnum):
        h = header(i)
        for name, spelled in targets.items():
            if _names(elf, names_at, names_size, h[0], spelled):
                if name in out:
                    raise IntegrityError(f"two {name} sections: which one is read is not one answer")
                _inside(elf, h[4], h[5], name)
                out[name] = (h[1], h[4], h[5], h[6])
    return out


def _inside(elf: bytes, offset: int, size: int, what: str) -> None:
    if offset + size > len(elf):
        raise IntegrityError(f"{what}: past the ELF file's end ({offset} + {size} > {len(elf)} bytes)")


def _names(elf: bytes, table_at: int, table_size: int, offset: int, spelled: bytes) -> bool:
    """Whether the string table's name at offset is `spelled` (with its NUL), read in place."""
    return offset < table_size and offset + len(spelled) <= table_size and elf.startswith(spelled, table_at + offset)


def _defined(elf: bytes, wanted: set[str], budget: list[int]) -> set[str]:
    """Which of the wanted symbols the ELF's symbol tables name: each entry compared in place with
    the few names wanted, never a name set built (memory stays the file's, whatever it holds).
    budget: [symbols the library may still have compared], charged."""
    secs = _sections(elf, tuple(name for pair in SYMBOL_TABLES for name in pair))
    targets = {w: w.encode() + b"\0" for w in wanted}
    found: set[str] = set()
    for table, strings in SYMBOL_TABLES:
        if table not in secs or strings not in secs:
            continue
        _, off, size, _ = secs[table]
        _, soff, ssize, _ = secs[strings]
        budget[0] -= size // 24
        if budget[0] < 0:
            raise IntegrityError(f"{table} holds {size // 24:,} symbols, past the {SYMBOLS_MAX:,} a library's symbol "
                                 f"tables may hold together (a HIP extension has a few thousand)")
        for i in range(0, size - size % 24, 24):
            name_off, = struct.unpack_from("<I", elf, off + i)
            found.update(w for w, spelled in targets.items() if _names(elf, soff, ssize, name_off, spelled))
    return found


def code_objects(shared_object: bytes) -> dict[str, bytes]:
    """{bundle entry id: code object} from a host object's .hip_fatbin offload bundle."""
    secs = _sections(shared_object, (".hip_fatbin",))
    if ".hip_fatbin" not in secs:
        raise IntegrityError("no .hip_fatbin section: the library carries no HIP device code")
    _, off, size, _ = secs[".hip_fatbin"]
    bundle = shared_object[off:off + size]
    if not bundle.startswith(BUNDLE_MAGIC):
        raise IntegrityError(".hip_fatbin is not a clang offload bundle")
    # clang-offload-bundler writes the entries one after another, each its own bytes: entries that
    # together claim more than the bundle holds overlap, and copied one by one a 1 MiB bundle of
    # 32,768 entries each spanning all of it would be 32 GiB. Checked before anything is copied.
    try:
        count, = struct.unpack_from("<Q", bundle, 24)
        if count > (len(bundle) - 32) // 24:  # each entry's header alone is 24 bytes
            raise IntegrityError(f".hip_fatbin's offload bundle claims {count} entries, more than its "
                                 f"{len(bundle)} bytes can hold: refused")
        spans, pos, total = [], 32, 0
        for _ in range(count):
            e_off, e_size, id_len = struct.unpack_from("<QQQ", bundle, pos)
            ident = bundle[pos + 24:pos + 24 + id_len].decode()
            pos += 24 + id_len
            total += e_size
            if e_off + e_size > len(bundle) or total > len(bundle) or pos > len(bundle):
                raise IntegrityError(f".hip_fatbin's offload bundle has entries past or overlapping its "
                                     f"{len(bundle)} bytes (at {untrusted.safe(ident, limit=64)}): refused")
            spans.append((ident, e_off, e_size))
    except (struct.error, UnicodeDecodeError):
        raise IntegrityError(".hip_fatbin's offload bundle is malformed (cut short, or an id not UTF-8)") from None
    if len({ident for ident, _, _ in spans}) != len(spans):
        raise IntegrityError(".hip_fatbin's offload bundle names an entry twice: which one is checked is not one answer")
    return {ident: bundle[e_off:e_off + e_size] for ident, e_off, e_size in spans}


def check_device_code(shared_object: bytes, arch: str, kernels: list[str]) -> list[dict]:
    """Every AMDGPU code object must be for `arch` and define every kernel; returns what was found.
    Bytes of any other shape (cut short, offsets past the end, names without an end) are one
    IntegrityError, never an exception of the parser's."""
    try:
        objects = code_objects(shared_object)
    except MALFORMED as e:
        raise IntegrityError(f"the library is not a well-formed ELF file ({type(e).__name__})") from None
    device = [(ident, blob) for ident, blob in objects.items() if ident.startswith("hip")]  # not the host entry
    if len(device) > HIP_OBJECTS_MAX:
        raise IntegrityError(f"the library's offload bundle holds {len(device)} device code objects, more than the "
                             f"{HIP_OBJECTS_MAX} a library checked here may (a recipe names one arch)")
    found, budget = [], [SYMBOLS_MAX]
    for ident, blob in device:
        try:
            found.append(_code_object(ident, blob, arch, kernels, budget))
        except MALFORMED as e:
            raise IntegrityError(f"device code object {untrusted.safe(ident, limit=64)} is not a well-formed ELF "
                                 f"file ({type(e).__name__})") from None
    if not found:
        raise IntegrityError(f"no AMDGPU code object for {arch} in the library")
    return found


def _code_object(ident: str, blob: bytes, arch: str, kernels: list[str], budget: list[int]) -> dict:
    machine, = struct.unpack_from("<H", blob, 0x12)
    flags, = struct.unpack_from("<I", blob, 0x30)
    name = untrusted.safe(ident, limit=64)  # the toolchain's words
    if machine != EM_AMDGPU:
        raise IntegrityError(f"device code object {name} is not an AMDGPU ELF (e_machine {machine})")
    if flags & 0xFF != ARCHS[arch]:
        named = {v: k for k, v in ARCHS.items()}.get(flags & 0xFF, hex(flags & 0xFF))
        raise IntegrityError(f"device code object {name} is for {named}, the recipe asks for {arch}")
    try:
        symbols = _defined(blob, {*kernels, *(f"{k}.kd" for k in kernels)}, budget)
    except IntegrityError as e:
        raise IntegrityError(f"device code object {name}: {e}") from None
    missing = [k for k in kernels if k not in symbols or f"{k}.kd" not in symbols]
    if missing:
        raise IntegrityError(f"device code object {name} lacks kernel(s) {', '.join(missing)}")
    return {"bundle_entry": ident, "mach": hex(flags & 0xFF), "kernels": sorted(kernels)}
