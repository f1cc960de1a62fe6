"""hip/: compiled for gfx942 in a toolchain image (here the Debian stand-in: the ROCm base cannot be
pulled), bit-reproducible, checked without a GPU, baked into the image and its record."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.errors import InputError, IntegrityError
from bakery.inputs import device_code, hip, hip_compile, hip_outputs
from bakery.oci.refs import Reference
from support import ROOT, cold_compile_cache, dev_policy, docker, invoke, last_line

KERNELS = ["swiglu_clamp_bf16_kernel", "topk_topp_mask_f32_kernel"]


@pytest.fixture(scope="module")
def two_compiles(toolchain, tmp_path_factory):
    """The recipe compiled twice, each into an empty cache of its own, both at once (a compile keeps
    one core busy; the machine has two): (recipe, [Compiled, Compiled], [cache, cache])."""
    from concurrent.futures import ThreadPoolExecutor

    from bakery.project import cache_dir

    recipe = hip.load(ROOT / "hip")
    hip_compile.toolchain_files(Reference.parse_pinned(toolchain), recipe.toolchain, cache_dir(create=True) / "toolchains",
                        log=lambda m: None)  # taken out once before, not by both compiles at once
    caches = [tmp_path_factory.mktemp("hip-cache") for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda c: hip_compile.compile_recipe(recipe, Reference.parse_pinned(toolchain), c, log=lambda m: None), caches))
    return recipe, done, caches


@pytest.fixture(scope="module")
def compiled(two_compiles):
    recipe, (first, _), (cache, _) = two_compiles
    return recipe, first.artifacts[0], cache


def copy_hip(tmp_path):
    dest = tmp_path / "hip"
    shutil.copytree(ROOT / "hip", dest)
    return dest


def test_device_code_is_gfx942_with_the_kernels(compiled):
    _, artifact, _ = compiled
    assert [o["mach"] for o in artifact.code_objects] == ["0x4c"]
    assert artifact.code_objects[0]["bundle_entry"].endswith("gfx942")
    assert "Debian clang version 19" in artifact.toolchain.compiler and "@sha256:" in artifact.toolchain.image
    assert str(artifact.toolchain) == f"{artifact.toolchain.compiler}; image {artifact.toolchain.image}"


def test_it_loads_in_cpu_torch_and_registers_its_operators(compiled):
    _, artifact, _ = compiled
    assert artifact.schema.splitlines() == ["bakery::swiglu_clamp(Tensor x, float limit) -> Tensor",
                                            "bakery::top_k_top_p_(Tensor(a!) logits, Tensor? k, Tensor? p) -> Tensor(a!)"]


def test_wrong_arch_or_missing_kernel_fails(compiled):
    _, artifact, _ = compiled
    with pytest.raises(IntegrityError, match="is for gfx942, the recipe asks for gfx90a"):
        device_code.check_device_code(artifact.data, "gfx90a", KERNELS)
    with pytest.raises(IntegrityError, match="lacks kernel.s. flash_attention_kernel"):
        device_code.check_device_code(artifact.data, "gfx942", KERNELS + ["flash_attention_kernel"])
    with pytest.raises(IntegrityError, match="no .hip_fatbin"):
        device_code.check_device_code((ROOT / ".venv" / "bin" / "python3").resolve().read_bytes(), "gfx942", KERNELS)


def elf_with_fatbin(bundle: bytes) -> bytes:
    """A 64-bit little-endian ELF of two sections: .shstrtab and a .hip_fatbin holding `bundle`."""
    import struct

    names = b"\0.shstrtab\0.hip_fatbin\0"
    body = names + bundle
    shoff = 64 + len(body)
    header = (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0,
                                                                    64, 0, 0, 64, 3, 1))
    sections = (b"\0" * 64 + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
                + struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, 64 + len(names), len(bundle), 0, 0, 1, 0))
    return header + body + sections


def test_an_offload_bundle_of_overlapping_entries_is_refused_before_any_copy():
    """Entries that each span the whole bundle: copied one by one, a 1 MiB bundle of such entries would
    be 32 GiB (here 128 KiB x 2,048: 256 MiB); refused in one line, as are more entries than the bundle has room for."""
    import struct

    size = 1 << 17
    count = 2048
    headers = b"".join(struct.pack("<QQQ", 0, size, 12) + b"hipv4-gf%04d" % i for i in range(count))
    bundle = device_code.BUNDLE_MAGIC + struct.pack("<Q", count) + headers
    bundle += b"\0" * (size - len(bundle))
    with pytest.raises(IntegrityError, match="entries past or overlapping its 131072 bytes"):
        device_code.code_objects(elf_with_fatbin(bundle))
    many = device_code.BUNDLE_MAGIC + struct.pack("<Q", 1 << 60) + b"\0" * 64
    with pytest.raises(IntegrityError, match="claims 1152921504606846976 entries"):
        device_code.code_objects(elf_with_fatbin(many))
    with pytest.raises(IntegrityError, match="is malformed"):
        device_code.code_objects(elf_with_fatbin(device_code.BUNDLE_MAGIC + struct.pack("<Q", 2)
                                                  + struct.pack("<QQQ", 0, 0, 20) + b"\0" * 24))
    one = device_code.BUNDLE_MAGIC + struct.pack("<Q", 1) + struct.pack("<QQQ", 60, 4, 4) + b"host" + b"code"
    assert device_code.code_objects(elf_with_fatbin(one)) == {"host": b"code"}


def test_malformed_device_code_is_one_line_never_a_parser_exception():
    """A hostile toolchain's output of any shape is one IntegrityError: a code object shorter than its
    ELF header (0x34 bytes), an ELF whose section table lies past its end, a symbol table past it; and
    a string table without terminators, named by every symbol, costs no memory (each name was copied
    out whole: 16,384 symbols into a 4 MiB table asked for 64 GiB)."""
    import struct
    import tracemalloc

    def bundle_of(code: bytes) -> bytes:
        return device_code.BUNDLE_MAGIC + struct.pack("<Q", 1) + struct.pack("<QQQ", 62, len(code), 6) + b"hipv4-" + code

    short = elf_with_fatbin(bundle_of(b"\x7fELF" + b"\0" * 0x20))
    with pytest.raises(IntegrityError, match="device code object hipv4- is not a well-formed ELF file .error."):
        device_code.check_device_code(short, "gfx942", KERNELS)
    past = bytearray(elf_with_fatbin(bundle_of(b"")))
    past[0x28:0x30] = struct.pack("<Q", len(past) + 1)  # the section table past the file's end
    with pytest.raises(IntegrityError, match="the library is not a well-formed ELF file"):
        device_code.check_device_code(bytes(past), "gfx942", KERNELS)
    # an AMDGPU gfx942 object whose .strtab holds 4 MiB without a NUL, named by 16,384 symbols
    strtab = b"k" * (4 << 20)
    symtab = b"".join(struct.pack("<IBBHQQ", 1 + i, 0, 0, 0, 0, 0) for i in range(16384))
    names = b"\0.shstrtab\0.symtab\0.strtab\0"
    body = names + symtab + strtab
    head = (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, device_code.EM_AMDGPU, 1, 0, 0,
                                                                64 + len(body), device_code.ARCHS["gfx942"],
                                                                64, 0, 0, 64, 4, 1))
    sections = (b"\0" * 64 + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
                + struct.pack("<IIQQQQIIQQ", 11, 2, 0, 0, 64 + len(names), len(symtab), 3, 0, 8, 24)
                + struct.pack("<IIQQQQIIQQ", 19, 3, 0, 0, 64 + len(names) + len(symtab), len(strtab), 0, 0, 1, 0))
    endless = elf_with_fatbin(bundle_of(head + body + sections))
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match="device code object hipv4- lacks kernel"):
            device_code.check_device_code(endless, "gfx942", KERNELS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(endless), peak  # the object copied out of its bundle once, and no more
    beyond = bytearray(endless)
    strtab_header = beyond.rindex(struct.pack("<II", 19, 3))
    beyond[strtab_header + 32:strtab_header + 40] = struct.pack("<Q", 1 << 40)  # its size: 1 TiB
    with pytest.raises(IntegrityError, match=r"device code object hipv4-.*\.strtab: past the ELF file's end"):
        device_code.check_device_code(bytes(beyond), "gfx942", KERNELS)
    # a section table at 2^64 - 64: struct's OverflowError, not its error (fourth attacker review)
    huge = bytearray(elf_with_fatbin(bundle_of(b"")))
    huge[0x28:0x30] = struct.pack("<Q", (1 << 64) - 64)
    with pytest.raises(IntegrityError, match="the library is not a well-formed ELF file .OverflowError."):
        device_code.check_device_code(bytes(huge), "gfx942", KERNELS)


def code_object_with(symbols: int, alias: bool = False) -> bytes:
    """A gfx942 code object whose .symtab holds `symbols` entries, the kernel k and its k.kd among
    them (and, alias, whose .dynsym/.dynstr are the same bytes again)."""
    import struct

    symtab = b"".join(struct.pack("<IBBHQQ", 3 if i == 1 else 1, 0, 0, 0, 0, 0) for i in range(symbols))
    names = b"\0.shstrtab\0.symtab\0.strtab\0.dynsym\0.dynstr\0"
    strtab = b"\0k\0k.kd\0"
    body = names + symtab + strtab
    head = (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, device_code.EM_AMDGPU, 1, 0, 0,
                                                                64 + len(body), device_code.ARCHS["gfx942"],
                                                                64, 0, 0, 64, 6 if alias else 4, 1))
    at_symtab, at_strtab = 64 + len(names), 64 + len(names) + len(symtab)
    sections = (b"\0" * 64 + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
                + struct.pack("<IIQQQQIIQQ", 11, 2, 0, 0, at_symtab, len(symtab), 3, 0, 8, 24)
                + struct.pack("<IIQQQQIIQQ", 19, 3, 0, 0, at_strtab, len(strtab), 0, 0, 1, 0))
    if alias:
        sections += (struct.pack("<IIQQQQIIQQ", 27, 11, 0, 0, at_symtab, len(symtab), 5, 0, 8, 24)
                     + struct.pack("<IIQQQQIIQQ", 35, 3, 0, 0, at_strtab, len(strtab), 0, 0, 1, 0))
    return head + body + sections


def bundle_of_objects(*codes: bytes) -> bytes:
    import struct

    headers, data = b"", b""
    at = 32 + sum(24 + 12 for _ in codes)
    for i, code in enumerate(codes):
        headers += struct.pack("<QQQ", at + len(data), len(code), 12) + b"hipv4-gfx%03d" % i
        data += code
    return elf_with_fatbin(device_code.BUNDLE_MAGIC + struct.pack("<Q", len(codes)) + headers + data)


def test_symbol_tables_past_what_a_library_holds_together_are_refused(monkeypatch):
    """Each symbol is compared in a Python loop, outside the sandbox and its time limit: 24 MiB of
    symbols took 3.5 s (fourth attacker review), a 1 GiB .so would take minutes. The library's tables
    together, each code object's and each alias of the same bytes counted (fifth review), hold at
    most SYMBOLS_MAX (small here), and a bundle at most HIP_OBJECTS_MAX device code objects."""
    monkeypatch.setattr(device_code, "SYMBOLS_MAX", 100, raising=False)  # without the cap: read whole
    with pytest.raises(IntegrityError, match="device code object hipv4-gfx000: .symtab holds 101 symbols, past the 100"):
        device_code.check_device_code(bundle_of_objects(code_object_with(101)), "gfx942", ["k"])
    with pytest.raises(IntegrityError, match="hipv4-gfx000: .dynsym holds 60 symbols, past the 100 a library's symbol"):
        device_code.check_device_code(bundle_of_objects(code_object_with(60, alias=True)), "gfx942", ["k"])
    with pytest.raises(IntegrityError, match="hipv4-gfx001: .symtab holds 60 symbols, past the 100"):
        device_code.check_device_code(bundle_of_objects(code_object_with(60), code_object_with(60)), "gfx942", ["k"])
    monkeypatch.setattr(device_code, "HIP_OBJECTS_MAX", 2, raising=False)
    with pytest.raises(IntegrityError, match="holds 3 device code objects, more than the 2"):
        device_code.check_device_code(bundle_of_objects(*[code_object_with(1)] * 3), "gfx942", ["k"])


def test_two_compiles_are_bit_identical(two_compiles):
    _, (first, again), _ = two_compiles
    assert first.origin == again.origin == "compiled"  # each compiled into its own empty cache
    assert hashlib.sha256(again.artifacts[0].data).digest() == hashlib.sha256(first.artifacts[0].data).digest()


def test_fixed_cuid_makes_object_names_irrelevant(compiled, toolchain, tmp_path):
    """HIP's default compilation-unit id hashes the compile command, object name included: another
    build tree gives other bytes. With the recipe's fixed -cuid the library does not change."""
    recipe, artifact, _ = compiled
    fixed = hip.script(recipe)
    unfixed = "\n".join(line.replace("-cuid=", "-D_no_cuid=") for line in fixed.splitlines())

    def build(shell: str, name: str) -> bytes:
        out = tmp_path / name
        out.mkdir()
        hip_compile.run_toolchain(recipe, Reference.parse_pinned(toolchain), shell, out, log=lambda m: None)
        return (out / "_C_stable_libtorch.so").read_bytes()

    def elsewhere(shell: str) -> str:  # the same compile with other object names
        return shell.replace(".hip0.o", ".hip0.elsewhere.o").replace(".cxx0.o", ".cxx0.elsewhere.o")

    # the module's compile ran `fixed` itself (compile_recipe runs hip.script): it is the first of the
    # pair; the other three run two at once (a compile keeps one core busy)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        moved, plain, plain_moved = pool.map(build, [elsewhere(fixed), unfixed, elsewhere(unfixed)], ["b", "c", "d"])
    assert artifact.data == moved
    assert plain != plain_moved


def test_recipe_errors(tmp_path):
    root = copy_hip(tmp_path)
    recipe = root / "extensions.yaml"
    original = recipe.read_text()
    recipe.write_text(original.replace("arch: gfx942", "arch: gfx9000"))
    with pytest.raises(InputError, match="unknown arch 'gfx9000'; known: gfx90a"):
        hip.load(root)
    recipe.write_text(original.replace("src/kernels.hip", "src/missing.hip"))
    with pytest.raises(InputError, match="source: 'src/missing.hip' is not a file inside"):
        hip.load(root)
    recipe.write_text(original.replace("hip_flags: [-O3, -std=c++17]", "hip_flags: [-O3, {std: c++17}]"))
    with pytest.raises(InputError, match=r"extensions\[0\].hip_flags must be a list of strings"):
        hip.load(root)  # was a TypeError from shlex.quote when the compile script was written
    secret = tmp_path / "host-secret"
    secret.write_text("a key of the building host")
    for name in (str(secret), "../host-secret"):  # absolute, or out through '..'
        recipe.write_text(original.replace("src/kernels.hip", name))
        with pytest.raises(InputError, match="is not a file inside"):
            hip.load(root)
    (root / "src" / "link.hip").symlink_to(secret)  # or out through a link
    recipe.write_text(original.replace("src/kernels.hip", "src/link.hip"))
    with pytest.raises(InputError, match="a link out of it"):
        hip.load(root)
    recipe.write_text(original.replace("    - usr/share/doc\n", "".join(f"    - x{i}\n" for i in range(300))))
    with pytest.raises(InputError, match="at most 256 patterns"):
        hip.load(root)
    # a rebuilt revision's recipe is read by the broker, outside the sandbox: never through a link, nor a
    # FIFO or a device (a link to /dev/zero would fill memory)
    recipe.unlink()
    recipe.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="cannot read"):
        hip.load(root)
    recipe.unlink()
    os.mkfifo(recipe)
    with pytest.raises(InputError, match="not a regular file"):
        hip.load(root)


def test_compiler_failure_shows_its_stderr_and_bakes_nothing(project, fixture_base):
    kernels = project / "hip" / "src" / "kernels.hip"
    kernels.write_text(kernels.read_text().replace("return gpu_get_last_error()", "return gpu_get_last_eror()", 1))
    result = invoke(project, "build", "--base", str(fixture_base), "--push", "127.0.0.1:5000/test/broken:1")
    assert result.returncode == 6
    assert "compiling hip/ failed" in result.stderr and "gpu_get_last_eror" in result.stderr
    assert not (project / "out" / "build-record.json").exists()


def test_a_base_without_a_toolchain_is_refused(project, fixture_base):
    result = invoke(project, "compile", "--toolchain", str(fixture_base))
    assert result.returncode == 6
    assert "has no HIP compiler" in result.stderr and "invoke toolchain" in result.stderr


def test_build_bakes_the_outputs_and_records_them(project, registry, fixture_base, compiled):
    _, artifact, _ = compiled
    result = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/kernels:1")
    assert result.returncode == 0, result.stderr
    record = json.loads((project / "out" / "build-record.json").read_text())
    [baked] = record["artifacts"]
    assert baked["sha256"] == hashlib.sha256(artifact.data).hexdigest()
    assert baked["path"] == "/usr/local/lib/python3.12/dist-packages/bakery_kernels/_C_stable_libtorch.so"
    assert {s["path"] for s in baked["sources"]} == {"hip/src/kernels.hip", "hip/src/binding.cpp", "hip/src/gpu_compat.h"}
    # which vLLM function each operator serves, in the record and in the SBOM's word for the file
    assert {(s["operator"], s["function"]) for s in baked["serves"]} == {
        ("bakery::top_k_top_p_", "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p"),
        ("bakery::swiglu_clamp", "vllm.model_executor.layers.activation.SiluAndMulWithClamp.forward_native")}
    from bakery.trust import sbom as sbom_mod
    from bakery.trust.record import BuildRecord
    spdx = sbom_mod.predicate(BuildRecord.from_json(record), f"{registry}/test/kernels")
    [package] = [p for p in spdx["packages"] if p["SPDXID"].startswith("SPDXRef-Artifact")]
    assert "bakery::top_k_top_p_ serves vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p" in package["comment"]
    ref = last_line(result)
    docker("pull", "-q", ref)
    out = docker("run", "--rm", "--entrypoint", "sh", ref, "-c",
                 "sha256sum /usr/local/lib/python3.12/dist-packages/bakery_kernels/*; "
                 "grep -c _C_stable_libtorch /etc/bakery/manifest.json").stdout
    assert baked["sha256"] in out and out.strip().endswith("1")


def test_python_glue_falls_back_without_the_extension():
    """On a machine without the compiled library (or on CPU tensors) the glue uses PyTorch."""
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("glue", ROOT / "hip" / "bakery_kernels" / "__init__.py")
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    glue = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(glue)
    assert glue.HAVE_EXTENSION is False
    logits = torch.tensor([[float("nan"), 1.0, float("inf"), float("-inf"), 1.0]])
    assert glue.top_k_top_p(logits, torch.tensor([2]), None).tolist() == [[-float("inf"), 1.0, float("inf")] + [-float("inf")] * 2]
    x = torch.tensor([[12.0, -3.0, 20.0, -15.0]], dtype=torch.bfloat16)
    want = torch.nn.functional.silu(torch.tensor([10.0, -3.0])) * torch.tensor([10.0, -10.0])
    assert torch.allclose(glue.swiglu_clamp(x, 10.0).float(), want.to(torch.bfloat16).float())


# -- the compile cache that travels ----------------------------------------------------------------

def pushed(tag: str) -> str:
    """A local image pushed, named by digest (REF@sha256:...)."""
    digest = [w for w in docker("push", tag).stdout.split() if w.startswith("sha256:")][0]
    return f"{tag.rpartition(':')[0]}@{digest}"


@pytest.fixture(scope="module")
def pinned_toolchain(toolchain):
    """The stand-in toolchain, named by digest in the registry, as the ROCm base is in production."""
    return toolchain


def test_the_sandbox_compiles_the_bytes_a_container_of_the_image_compiles(compiled, toolchain, tmp_path):
    """The reference: the same script run by Docker in a container of the same image (how hip/ was
    compiled before the toolchain's files were taken out of its layers). Same library, byte for byte."""
    recipe, artifact, _ = compiled
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    docker("pull", "-q", toolchain)
    docker("run", "--rm", "--network", "none", "--cap-drop", "ALL", "--user", "65534:65534", "-e", "HOME=/tmp",
           "-v", f"{recipe.root}:/src:ro", "-v", f"{out}:/out", "--entrypoint", "/bin/sh", toolchain, "-c",
           hip.script(recipe))
    assert hashlib.sha256((out / "_C_stable_libtorch.so").read_bytes()).hexdigest() == \
        hashlib.sha256(artifact.data).hexdigest()
    assert (out / "_C_stable_libtorch.schema").read_text() == artifact.schema


PASSWORD = {"BAKERY_KEY_PASSWORD": "pw"}


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory) -> Path:
    """k/release.{key,pub}: the policy's release key; other/release.*: a key the policy does not list."""
    root = tmp_path_factory.mktemp("release-keys")
    for where in ("k", "other"):
        assert invoke(ROOT, "keygen", "--out", str(root / where), env=PASSWORD).returncode == 0
    return root


def trusting(project: Path, keys: Path, base) -> list[str]:
    """Build arguments that name the release key: a signed kernel artifact may then be baked."""
    return ["--key", str(keys / "k" / "release.pub"), "--policy", str(dev_policy(project.parent / "p.yaml", base))]


def test_kernels_travel_as_a_signed_oci_artifact_and_need_no_engine(project, registry, fixture_base, pinned_toolchain,
                                                                    release_keys, tmp_path):
    from bakery.oci.refs import Reference
    from bakery.oci.registry import Registry
    from bakery.trust import provenance, sbom
    from bakery.trust.record import BuildRecord

    env = {"BAKERY_TOOLCHAIN": pinned_toolchain}
    first = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/img:1", env=env)
    assert first.returncode == 0, first.stderr
    record = json.loads((project / "out" / "build-record.json").read_text())
    kernels = record["kernels"]
    assert kernels["artifact"].startswith(f"{registry}/travel/img@sha256:")
    body, _, digest = Registry(registry).get_manifest(Reference(registry, "travel/img", f"kernels-{kernels['key']}"))
    assert kernels["artifact"].endswith(str(digest))
    layers = {layer["annotations"]["org.opencontainers.image.title"]: layer["digest"] for layer in json.loads(body)["layers"]}
    assert layers["_C_stable_libtorch.so"] == "sha256:" + record["artifacts"][0]["sha256"]
    # the provenance and the SBOM name the artifact by digest
    typed = BuildRecord.from_json(record)
    deps = provenance.predicate(typed)["buildDefinition"]["resolvedDependencies"]
    assert {"uri": f"docker://{registry}/travel/img@{digest}", "digest": {"sha256": digest.hex},
            "name": "kernel artifact"} in deps
    packages = sbom.predicate(typed, f"{registry}/travel/img")["packages"]
    assert next(p for p in packages if p["SPDXID"] == "SPDXRef-KernelArtifact")["checksums"][0]["checksumValue"] \
        == digest.hex
    # the sign job signs the artifact the record names, with the image
    signed = invoke(project, "attest", last_line(first), "--key", str(release_keys / "k" / "release.key"),
                    env=PASSWORD)
    assert signed.returncode == 0 and f"kernel artifact {kernels['artifact']} signed" in signed.stderr, signed.stderr
    # another machine: no compile cache, no Docker engine at all; the signed artifact is enough
    second = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/img:2",
                    *trusting(project, release_keys, fixture_base),
                    env={**env, "BAKERY_CACHE": str(cold_compile_cache(tmp_path)),
                         "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert second.returncode == 0, second.stderr
    assert last_line(second) == last_line(first)  # the same image
    assert "(signed by a release key): not compiled here, the base not pulled" in second.stderr
    assert "compiling hip/" not in second.stderr
    again = json.loads((project / "out" / "build-record.json").read_text())["kernels"]
    assert again == {**kernels, "origin": "registry"}


def test_without_a_release_key_the_registrys_artifact_is_not_used(project, registry, fixture_base, pinned_toolchain,
                                                                  tmp_path):
    """The committed policy names no release key: nothing can vouch for an artifact, so the build
    compiles (and pushes its own artifact over the tag) rather than trusting one."""
    env = {"BAKERY_TOOLCHAIN": pinned_toolchain}
    assert invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/nokey:1",
                  env=env).returncode == 0
    cold = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/nokey:2",
                  env={**env, "BAKERY_CACHE": str(cold_compile_cache(tmp_path, with_toolchain=True))})
    assert cold.returncode == 0, cold.stderr
    assert "no release key in the policy" in cold.stderr and "compiling hip/" in cold.stderr
    assert json.loads((project / "out" / "build-record.json").read_text())["kernels"]["origin"] == "compiled"


def test_a_signed_but_inconsistent_kernel_artifact_is_refused(project, registry, fixture_base, pinned_toolchain,
                                                              release_keys, tmp_path):
    """Even under a release-key signature, every file must match the sha256 the artifact's config records."""
    from bakery.oci.refs import Descriptor, Reference
    from bakery.oci.registry import OCI_MANIFEST, Registry
    from bakery.trust import attest as attest_mod, keys, sign

    env = {"BAKERY_TOOLCHAIN": pinned_toolchain}
    assert invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/evil:1",
                  env=env).returncode == 0
    key = json.loads((project / "out" / "build-record.json").read_text())["kernels"]["key"]
    reg = Registry(registry)
    body, _, _ = reg.get_manifest(Reference(registry, "travel/evil", f"kernels-{key}"))
    doc = json.loads(body)
    so = next(layer for layer in doc["layers"] if layer["annotations"]["org.opencontainers.image.title"].endswith(".so"))
    evil = reg.fetch_blob("travel/evil", Descriptor.from_json(so)) + b"\0trojan"
    desc = Descriptor.of(so["mediaType"], evil)
    reg.upload_blob("travel/evil", desc, lambda: iter([evil]))
    so.update(digest=str(desc.digest), size=desc.size)  # consistent digests; the config's sha256 is not
    digest = reg.put_manifest("travel/evil", f"kernels-{key}", json.dumps(doc).encode(), OCI_MANIFEST)
    import os

    os.environ.update(PASSWORD)
    try:
        signer = sign.Signer(keys.load_private(release_keys / "k" / "release.key"))
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    attest_mod.sign_artifact(Reference(registry, "travel/evil", None, digest), signer)
    result = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/evil:2",
                    *trusting(project, release_keys, fixture_base),
                    env={**env, "BAKERY_CACHE": str(cold_compile_cache(tmp_path))})
    assert result.returncode == 5 and "does not match the sha256 its config records" in result.stderr, result.stderr


def test_recompile_builds_past_an_unsigned_artifact(project, registry, fixture_base, pinned_toolchain, release_keys,
                                                    tmp_path):
    """What the refusal tells the user to do works: --recompile compiles here and pushes its own artifact."""
    env = {"BAKERY_TOOLCHAIN": pinned_toolchain}
    first = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/re:1", env=env)
    assert first.returncode == 0, first.stderr
    args = ["build", "--base", str(fixture_base), "--push", f"{registry}/travel/re:2",
            *trusting(project, release_keys, fixture_base)]
    cold = {**env, "BAKERY_CACHE": str(cold_compile_cache(tmp_path / "a"))}
    refused = invoke(project, *args, env=cold)
    assert refused.returncode == 5 and "--recompile" in refused.stderr, refused.stderr
    again = invoke(project, *args, "--recompile",
                   env={**env, "BAKERY_CACHE": str(cold_compile_cache(tmp_path / "b", with_toolchain=True))})
    assert again.returncode == 0 and "compiling hip/" in again.stderr, again.stderr
    assert last_line(again) == last_line(first)


def test_compile_verify_recompiles_to_the_same_bytes(project, pinned_toolchain):
    result = invoke(project, "compile", "--toolchain", pinned_toolchain, "--verify")
    assert result.returncode == 0, result.stderr
    assert "_C_stable_libtorch.so  byte-identical when compiled again" in result.stdout


def test_disk_check_knows_when_nothing_need_be_compiled(project, registry, fixture_base, pinned_toolchain,
                                                        release_keys):
    env = {"BAKERY_TOOLCHAIN": pinned_toolchain}
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/travel/disk:1", env=env)
    assert built.returncode == 0
    disk = ["disk", "--base", str(fixture_base), "--unless-cached-in", f"{registry}/travel/disk",
            *trusting(project, release_keys, fixture_base)]
    unsigned = invoke(project, *disk, env=env)
    assert unsigned.returncode == 0 and "will not be used" in unsigned.stderr and "GiB free" in unsigned.stdout
    assert invoke(project, "attest", last_line(built), "--key", str(release_keys / "k" / "release.key"),
                  env=PASSWORD).returncode == 0
    cached = invoke(project, *disk, env=env)
    assert cached.returncode == 0, cached.stderr
    assert "holds the kernels, signed by a release key; nothing will be compiled" in cached.stdout
    elsewhere = invoke(project, "disk", "--base", str(fixture_base), "--unless-cached-in", f"{registry}/travel/empty",
                       env=env)
    assert elsewhere.returncode == 0 and "the build will compile" in elsewhere.stderr and "GiB free" in elsewhere.stdout


def test_a_toolchain_that_leaves_a_link_in_out_reads_nothing_of_the_host(toolchain, tmp_path):
    """The compile runs the base's code (its compiler, its python) in the sandbox, whose /out is a
    host folder. A hostile toolchain leaves toolchain.txt as a link to a host file (on a build
    runner: the registry login): we must refuse it without reading, hashing or pushing it."""
    secret = tmp_path / "docker-config.json"
    secret.write_text('{"auths": {"ghcr.io": {"auth": "cHVzaDp0b2tlbg=="}}}')
    wrapper = ("#!/bin/sh\n/usr/bin/python3.real \"$@\"\nrc=$?\n"
               f"if [ -e /out/_C_stable_libtorch.so ]; then rm -f /out/toolchain.txt; ln -s {secret} /out/toolchain.txt; fi\n"
               "exit $rc\n")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "python3").write_text(wrapper)
    (tmp_path / "ctx" / "python3").chmod(0o755)  # COPY keeps the mode (Debian's engine has no BuildKit --chmod)
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {toolchain}\nRUN mv /usr/bin/python3 /usr/bin/python3.real\nCOPY python3 /usr/bin/python3\n")
    hostile = f"{toolchain.split('/')[0]}/bakery/hostile-toolchain:test"
    docker("build", "-q", "-t", hostile, str(tmp_path / "ctx"))
    result = invoke(ROOT, "compile", "--toolchain", pushed(hostile), env={"BAKERY_CACHE": str(tmp_path / "cache")})
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 5 and len(errors) == 1, result.stderr
    assert "compile output toolchain.txt is not a regular file" in errors[0]
    assert "cHVzaDp0b2tlbg" not in result.stdout + result.stderr
    assert [p.name for p in (tmp_path / "cache" / "hip").iterdir()] == []  # nothing kept


def test_each_operator_serves_a_vllm_function_through_a_baked_overlay():
    """Nothing baked is dead weight: every operator the extension registers serves the vLLM
    function extensions.yaml names, through a baked overlay whose patch, applied to the locked
    stock bytes, calls that operator's glue inside that very function."""
    import ast

    from bakery.inputs import overlays as overlays_mod, patch as patch_mod

    recipe = hip.load(ROOT / "hip")
    registered = {o.id: o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml")}
    lock = overlays_mod.read_lock(ROOT / "overlays" / "overlays.lock")
    operators = set(re.findall(r'm\.def\("(\w+)\(', (ROOT / "hip" / "src" / "binding.cpp").read_text()))
    glue = ast.parse((ROOT / "hip" / "bakery_kernels" / "__init__.py").read_text())
    for ext in recipe.extensions:
        assert {s.operator.removeprefix("bakery::") for s in ext.serves} == operators
        for use in ext.serves:
            op, overlay = use.operator.removeprefix("bakery::"), registered[use.overlay]
            entry = next(n for n in glue.body if isinstance(n, ast.FunctionDef) and n.name == op.rstrip("_"))
            assert overlay.baked and any(isinstance(n, ast.Call) and ast.unparse(n.func) == f"torch.ops.bakery.{op}"
                                         for n in ast.walk(entry)), (op, "the glue does not call the operator")
            parts = use.function.split(".")
            cut = next(i for i in range(len(parts), 0, -1) if overlay.target.endswith("/".join(parts[:i]) + ".py"))
            entry_of = lock.entry(overlay.id)
            assert entry_of is not None and entry_of.base_sha256, (overlay.id, "not in overlays.lock")
            stock = overlays_mod.read_stock(ROOT / "overlays", entry_of.base_sha256)
            assert stock is not None, (overlay.id, "its stock bytes are not stored")
            tree = ast.parse(patch_mod.apply(overlay.for_target(stock).parsed(), stock)[0])
            scope: ast.AST = tree
            for name in parts[cut:]:
                scope = next(n for n in ast.walk(scope) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                             and n.name == name)
            calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(scope) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
            assert f"_bakery_kernels.{op.rstrip('_')}" in calls, (use, calls)


def test_a_build_records_only_what_its_overlays_make_served():
    """A serves: claim holds through its overlay: a build that does not bake that overlay (retired as
    fixed upstream, or other overlays) leaves the claim out of its record and SBOM, and says so."""
    recipe = hip.load(ROOT / "hip")
    both = {"deterministic-sampler-topk-topp", "exact-swiglu-clamp-kernel"}
    assert hip.served(recipe, both, log=lambda m: None) == recipe
    said: list[str] = []
    only_swiglu = hip.served(recipe, {"exact-swiglu-clamp-kernel"}, log=said.append)
    assert [u.overlay for u in only_swiglu.extensions[0].serves] == ["exact-swiglu-clamp-kernel"]
    assert len(said) == 1 and "only through overlay deterministic-sampler-topk-topp" in said[0]
    assert only_swiglu.key("toolchain") == recipe.key("toolchain")  # the same compile: only the claim differs


@pytest.mark.slow
def test_a_baked_library_that_does_not_load_stops_the_import(tmp_path):
    """In the image the library sits beside the glue: if it does not load in the base's torch, the
    import fails with a RuntimeError, which the overlays' `except ImportError` does not swallow, so
    vLLM stops instead of serving the stock sampler it was routed away from."""
    pytest.importorskip("torch")
    package = tmp_path / "bakery_kernels"
    package.mkdir()
    (package / "__init__.py").write_bytes((ROOT / "hip" / "bakery_kernels" / "__init__.py").read_bytes())
    (package / "_C_stable_libtorch.so").write_bytes(b"not an ELF")
    run = subprocess.run([sys.executable, "-c", "import bakery_kernels"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode != 0 and "RuntimeError: bakery_kernels:" in run.stderr and "does not load" in run.stderr


def test_a_recorded_toolchain_reads_back_as_the_image_a_rebuild_pulls():
    """The record (and the signed provenance) says "COMPILER; image IMAGE"; reproduce reads IMAGE back.
    A compiler line that itself says "; image " does not confuse it: the image is what comes last."""
    text = "clang version 19 (odd; image build); image sha256:" + "d" * 64
    assert hip.Toolchain.parse(text) == hip.Toolchain("clang version 19 (odd; image build)", "sha256:" + "d" * 64)
    assert str(hip.Toolchain.parse(text)) == text


def test_a_compile_that_fills_the_hosts_disk_under_out_is_stopped(toolchain, tmp_path, monkeypatch):
    """/out is the one host folder the compile (the toolchain's own code) writes: each file is
    capped, and all of them together too, watched while it runs (a small cap here; 2 GiB in use),
    so what it can write is the cap plus a quarter second's writing."""
    from bakery.project import cache_dir

    files = hip_compile.toolchain_files(Reference.parse_pinned(toolchain), hip.load(ROOT / "hip").toolchain, cache_dir(create=True) / "toolchains",
                                log=lambda m: None)
    monkeypatch.setattr(hip_compile, "OUT_LIMIT", 8 << 20)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the compile's uid writes here, as run_toolchain's folders allow
    # a MiB each 20 ms: the watch (every 0.25 s) stops it a few MiB past the cap, not at the 400 MiB
    fill = "i=0; while [ $i -lt 400 ]; do head -c 1048576 /dev/zero > /out/f$i; sleep 0.02; i=$((i+1)); done"
    status, said = hip_compile.run_compile(files, ROOT / "hip", fill, out)
    assert status == -9 and "under /out" in said, (status, said)
    assert sum(f.stat().st_size for f in out.iterdir()) < 64 << 20
    (tmp_path / "ok").mkdir(mode=0o777)
    (tmp_path / "ok").chmod(0o777)
    status, said = hip_compile.run_compile(files, ROOT / "hip", "head -c 1048576 /dev/zero > /out/one", tmp_path / "ok")
    assert status == 0, said  # the control: within the cap


def toolchain_root(toolchain):
    """The toolchain's files as every compile runs over them (extracted once into this machine's cache)."""
    from bakery.project import cache_dir

    return hip_compile.toolchain_files(Reference.parse_pinned(toolchain), hip.load(ROOT / "hip").toolchain, cache_dir(create=True) / "toolchains",
                               log=lambda m: None)


# 64 MiB to stdout, then 64 MiB to stderr: eight times the small file cap below, and 64 times the log read back
FLOOD = "yes stdout-0123456789 | head -c 67108864; yes stderr-0123456789 | head -c 67108864 >&2"


def test_a_compile_that_prints_past_the_limits_is_stopped_and_only_its_tail_comes_back(toolchain, tmp_path,
                                                                                    monkeypatch):
    """The compile's stdout and stderr go to files on this machine's disk, each capped like any file
    it writes (RLIMIT_FSIZE: 1 GiB in use, 8 MiB here): a writer past the cap is killed (SIGXFSZ).
    What is read back is the last LOG_LIMIT characters, never the whole: the files' tails are read
    by seek, so this process holds a few MiB whatever the compile printed."""
    import dataclasses
    import signal
    import tracemalloc

    from bakery import sandbox

    files = toolchain_root(toolchain)
    monkeypatch.setattr(sandbox, "COMPILE", dataclasses.replace(sandbox.COMPILE, files=8 << 20))
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    tracemalloc.start()
    try:
        status, said = hip_compile.run_compile(files, ROOT / "hip", FLOOD, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the shell's status is its last pipeline's: head, killed at the cap of stderr's file
    assert status == 128 + signal.SIGXFSZ, (status, said[-300:])
    assert len(said) <= hip_compile.LOG_LIMIT, len(said)
    assert "stderr-0123456789" in said[-100:], said[-100:]  # the tail: what it printed last
    # held here: the two files' tails (1 MiB each, read by seek), their text and the joined tail; not
    # the 16 MiB the files hold, nor the 128 MiB printed
    assert peak < 8 * hip_compile.LOG_LIMIT, f"{peak} bytes held to read back {len(said)} characters"


def test_the_rebuild_broker_answers_at_most_its_log_limit_of_a_flooding_compile(toolchain, registry, tmp_path,
                                                                            monkeypatch):
    """A rebuild's compile runs outside, through the broker, and its answer goes back into the
    sandbox: of a compile that prints past every limit, the answer carries the last 64 KiB."""
    import dataclasses
    import signal

    from bakery import sandbox
    from bakery.broker_client import UnixConnection
    from bakery.release import broker

    toolchain_root(toolchain)  # extracted before the broker's turn (it extracts the same, from the cache)
    monkeypatch.setattr(sandbox, "COMPILE", dataclasses.replace(sandbox.COMPILE, files=8 << 20))
    grant = broker.Grant(registry, "test/none", toolchain, ROOT / "hip")  # no base is read here
    with broker.serve(tmp_path, grant) as path:
        conn = UnixConnection(str(path), 600)
        try:
            conn.request("POST", "/bakery/compile", json.dumps({"toolchain": toolchain, "shell": FLOOD}).encode(),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    assert resp.status == 200, body[:300]
    answer = json.loads(body)
    assert answer["status"] == 128 + signal.SIGXFSZ, answer["status"]
    assert len(answer["logs"]) <= broker.LOG_LIMIT and "stderr-0123456789" in answer["logs"][-100:]
    assert len(body) < 2 * broker.LOG_LIMIT, len(body)  # the answer is the log and little else


# 512 MiB of address space, and its size printed: a compile that needs more memory than it may have
ALLOCATE = "python3 -c 'print(len(bytearray(512 << 20)))'"


def test_a_compile_that_allocates_past_its_memory_limit_fails(toolchain, tmp_path, monkeypatch):
    """Each process of the compile may map COMPILE.memory of address space (RLIMIT_AS: 16 GiB in use,
    256 MiB here): past it an allocation fails, and so does the compile. The same code under the
    compile's own limit runs (the control: the failure is the limit's, not the code's)."""
    import dataclasses

    from bakery import sandbox

    files = toolchain_root(toolchain)
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    status, said = hip_compile.run_compile(files, ROOT / "hip", ALLOCATE, out)
    assert status == 0 and said == str(512 << 20), (status, said)
    monkeypatch.setattr(sandbox, "COMPILE", dataclasses.replace(sandbox.COMPILE, memory=256 << 20))
    status, said = hip_compile.run_compile(files, ROOT / "hip", ALLOCATE, out)
    assert status != 0 and "MemoryError" in said, (status, said[-300:])


def test_a_compile_whose_out_the_watch_cannot_read_whole_is_stopped(toolchain, tmp_path):
    """Folders nested past what a path may be (made one `cd` at a time) hide what lies in them from
    a walk by path: the watch fails closed and stops the compile."""
    from bakery.project import cache_dir

    files = hip_compile.toolchain_files(Reference.parse_pinned(toolchain), hip.load(ROOT / "hip").toolchain, cache_dir(create=True) / "toolchains",
                                log=lambda m: None)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    deep = ("cd /out; d=$(printf 'a%.0s' $(seq 250)); i=0; while [ $i -lt 20 ]; do mkdir $d && cd $d; "
            "i=$((i+1)); done; head -c 1048576 /dev/zero > f; sleep 60")
    status, said = hip_compile.run_compile(files, ROOT / "hip", deep, out)
    assert status == -9 and "cannot be read" in said, (status, said)


def test_a_cache_entry_another_writer_finished_is_kept_only_when_it_holds_the_same_bytes(tmp_path):
    """Two runs fill one entry at once (a fetched artifact and a compile here): the second kept the
    first's whole entry whatever its bytes, and then recorded its own origin (registry, or compiled)
    for bytes it had not used (found by review). Kept now only when the outputs are the same bytes."""
    from bakery.files import atomic_dir

    def entry(data: bytes) -> dict:
        return {"k.so": hashlib.sha256(data).hexdigest()}

    dest = tmp_path / "entry"
    with atomic_dir(dest) as first:
        (first / "k.so").write_bytes(b"theirs")
        (first / "done.json").write_text(json.dumps({"sha256": entry(b"theirs")}))
    theirs = dest.stat().st_ino
    with atomic_dir(dest, keep=hip_outputs.same_outputs(entry(b"theirs"))) as same:
        (same / "k.so").write_bytes(b"theirs")
        (same / "done.json").write_text(json.dumps({"sha256": entry(b"theirs")}))
    assert dest.stat().st_ino == theirs  # the same bytes: theirs stays, a reader of it never sees it go
    with atomic_dir(dest, keep=hip_outputs.same_outputs(entry(b"ours"))) as other:
        (other / "k.so").write_bytes(b"ours")
        (other / "done.json").write_text(json.dumps({"sha256": entry(b"ours")}))
    assert (dest / "k.so").read_bytes() == b"ours"  # other bytes: ours, which is what this run records


def test_an_entry_another_run_puts_in_place_after_this_run_chose_its_own_is_refused(two_compiles, toolchain,
                                                                                    tmp_path, monkeypatch):
    """Found by review: the keep check held only at the rename; the outputs were read again by name
    afterwards, so a run whose entry another run replaced a moment later baked that run's bytes and
    recorded its own origin (a signed artifact, or its compile) for them. The other run is a stand-in
    here: this run's compile gives the real outputs, then a whole entry of other bytes takes the name."""
    recipe, (first, _), (cache, _) = two_compiles
    entry, theirs = cache / first.key[:24], tmp_path / "theirs"
    shutil.copytree(entry, theirs)
    for ext in recipe.extensions:
        (theirs / f"{ext.name}.so").write_bytes((entry / f"{ext.name}.so").read_bytes() + b"\0")
    (theirs / "done.json").write_text(json.dumps({
        **json.loads((entry / "done.json").read_text()),
        "sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in theirs.iterdir() if p.name != "done.json"}}))
    assert hip_outputs.outputs_whole(theirs) is None  # whole: only its bytes differ

    def compiled_then_replaced(recipe, toolchain, out, log):
        shutil.copytree(entry, out)  # this run's compile
        made = json.loads((out / "done.json").read_text())["sha256"]
        shutil.rmtree(out)
        shutil.copytree(theirs, out)  # the other run's rename lands
        return made

    monkeypatch.setattr(hip_compile, "_compile", compiled_then_replaced)
    with pytest.raises(IntegrityError, match="changed while this run read it"):
        hip_compile.compile_recipe(recipe, Reference.parse_pinned(toolchain), tmp_path / "cache", log=lambda m: None)


def test_a_broker_compile_clears_the_folder_a_killed_rebuild_left(toolchain, registry, tmp_path, monkeypatch):
    """Found by review: the broker's compile wrote into a temporary folder that a killed rebuild left
    for good (its outputs may reach OUTPUT_LIMIT), so repeated kills filled TMPDIR. It is now locked
    while filled, and the next compile removes one no live process holds."""
    import tempfile
    import time

    from bakery.broker_client import UnixConnection
    from bakery.release import broker

    toolchain_root(toolchain)
    tmp = tmp_path / "tmp"
    left = tmp / ".bakery-broker.partial-killed"  # what a killed rebuild's compile leaves
    (left / "sub").mkdir(parents=True)
    (left / "sub" / "k.so").write_bytes(b"\0" * 4096)
    old = time.time() - 600
    os.utime(left, (old, old))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    grant = broker.Grant(registry, "test/none", toolchain, ROOT / "hip")
    (tmp_path / "broker").mkdir()
    with broker.serve(tmp_path / "broker", grant) as path:
        conn = UnixConnection(str(path), 600)
        try:
            conn.request("POST", "/bakery/compile", json.dumps({"toolchain": toolchain, "shell": "exit 3"}).encode(),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    assert resp.status == 200 and json.loads(body)["status"] == 3, body[:300]
    assert sorted(os.listdir(tmp)) == [], os.listdir(tmp)  # the killed one's gone, and this one's own
