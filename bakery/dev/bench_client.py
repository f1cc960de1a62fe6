"""vLLM's own benchmark client (`vllm bench serve`) on this machine, for the acceptance gate's tests
and rehearsal, which drive a stand-in server with it (there is no MI300X here, and on one the gate
runs the image's own client). A venv with vLLM 0.26.0's wheel installed without its dependencies
(no GPU stack, no server), CPU torch, and what `vllm.benchmarks.serve` imports, as
requirements/bench-client.txt pins them; built once per machine and kept by the hash of that list."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from ..project import Project

# `vllm bench serve` is the vllm CLI's subcommand whose cmd is vllm.benchmarks.serve.main(args);
# the CLI itself imports the whole server (fastapi, xgrammar, ...), so the venv runs that function
# directly, with the arguments the subcommand parses
SCRIPT = """\
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def ensure(project: Path, log=lambda m: None, home: Path | None = None, python: str = sys.executable) -> Path:
    """The client's command, bin/vllm-bench-serve of the venv (built if `home` has none: default
    ~/.cache/bakery/bench-client), by `python`: it takes `vllm bench serve`'s arguments."""
    wanted = (Project(project).root / "requirements" / "bench-client.txt").read_text()
    home = home or Path.home() / ".cache" / "bakery" / "bench-client"
    venv = home / hashlib.sha256((wanted + SCRIPT + python).encode()).hexdigest()[:16]
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs build it once
        if not (venv / ".complete").exists():  # a venv's scripts name its folder: built where it stays
            log(f"building vLLM's benchmark client in {venv} (once per machine)")
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
            pins = [line for line in wanted.splitlines() if line and not line.startswith("#")]
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run(pip + [p for p in pins if not p.startswith("vllm==")], check=True)
            subprocess.run(pip + ["--no-deps"] + [p for p in pins if p.startswith("vllm==")], check=True)
            script = venv / "bin" / "vllm-bench-serve"
            script.write_text(f"#!{venv / 'bin' / 'python'}\n{SCRIPT}")
            script.chmod(0o755)
            (venv / ".complete").write_text("")
    return venv / "bin" / "vllm-bench-serve"


def tokenizer(client: Path, dest: Path) -> Path:
    """A small word-level tokenizer (Hugging Face's format) that the client loads in place of the
    model's: the stand-in counts a word as a token, and so does this. client: ensure()'s command."""
    if (dest / "tokenizer.json").exists():
        return dest
    script = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(4000)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>").save_pretrained(sys.argv[1])
"""
    subprocess.run([str(client.parent / "python"), "-c", script, str(dest)], check=True, capture_output=True)
    return dest
