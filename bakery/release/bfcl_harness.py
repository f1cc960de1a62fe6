"""BFCL's own harness for the acceptance gate's tool-call stage, run by the python of the BFCL venv
(bakery/release/bfcl.py builds it from requirements/bfcl.txt); bakery never imports this file.

    python bfcl_harness.py cases   < {"ids": [...]}                     > [{"id", "messages", "tools"}]
    python bfcl_harness.py score   < {"answers": {id: tool calls|null}}  > {id: {"valid", "error_type"}}

`cases` gives each case as BFCL's function-calling handler for OpenAI-compatible servers sends it:
its loader's entry (the language hint added to each function's description), its tools through
convert_to_tool in the OpenAI chat style, the first turn's messages. `score` reads each answer's
tool calls as that handler does ({name: json.loads(arguments)} per call; no call at all is the
answer's text, a miss) and judges it with BFCL's AST checker against BFCL's possible answers.
Nothing here scores: the checker is BFCL's."""

import atexit
import json
import os
import shutil
import sys
import tempfile
import types

MODEL = "bakery-acceptance-gate"  # the name the checker is told: its table entry is below

# BFCL's checker reads one flag of its model table: whether the model's API turned the dots of
# function names into underscores (convert_to_tool's OpenAI style does, as OpenAI allows no dot).
# That table's module imports every vendor handler BFCL has and their SDKs; it is left out, and
# this one entry given in its place, before the checker is imported.
_table = types.ModuleType("bfcl_eval.constants.model_config")
_table.MODEL_CONFIG_MAPPING = {MODEL: types.SimpleNamespace(underscore_to_dot=True)}  # type: ignore[attr-defined]
sys.modules[_table.__name__] = _table
# BFCL's loader takes a file lock under its project root (by default beside the installed package)
os.environ["BFCL_PROJECT_ROOT"] = tempfile.mkdtemp(prefix="bfcl-")
atexit.register(shutil.rmtree, os.environ["BFCL_PROJECT_ROOT"], True)

from bfcl_eval.constants.enums import Language, ModelStyle  # noqa: E402
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI  # noqa: E402
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker  # noqa: E402
from bfcl_eval.model_handler.utils import convert_to_tool  # noqa: E402
from bfcl_eval.utils import (  # noqa: E402
    extract_test_category_from_id,
    is_empty_output,
    is_function_calling_format_output,
    load_dataset_entry,
    load_ground_truth_entry,
)

CATEGORIES = ("simple_python", "multiple")  # single-turn, Python, AST-checked: what the gate runs


def _entries(ids):
    wanted: dict[str, set[str]] = {}
    for case in ids:
        category = extract_test_category_from_id(case)
        if category not in CATEGORIES:
            raise SystemExit(f"BFCL case {case!r} is not in {' or '.join(CATEGORIES)}")
        wanted.setdefault(category, set()).add(case)
    found = {}
    for category, cases in wanted.items():
        truth = {t["id"]: t for t in load_ground_truth_entry(category)}
        for entry in load_dataset_entry(category):
            if entry["id"] in cases:
                found[entry["id"]] = (category, entry, truth[entry["id"]]["ground_truth"])
    missing = [case for case in ids if case not in found]
    if missing:
        raise SystemExit(f"BFCL has no case {', '.join(missing[:5])}")
    return found


def cases(ids):
    found = _entries(ids)
    return [{"id": case, "messages": found[case][1]["question"][0],
             "tools": convert_to_tool(found[case][1]["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)}
            for case in ids]


def _decoded(calls):
    """The OpenAI-compatible handler's reading of an answer: each tool call as {name: arguments}."""
    if not isinstance(calls, list) or not calls:
        return None
    return [{call["name"]: json.loads(call["arguments"])} for call in calls]


def score(answers):
    found = _entries(list(answers))
    out = {}
    for case, calls in answers.items():
        category, entry, truth = found[case]
        try:
            decoded = _decoded(calls)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            out[case] = {"valid": False, "error_type": f"ast_decoder:decoder_failed ({type(e).__name__})"}
            continue
        if decoded is None or is_empty_output(decoded) or not is_function_calling_format_output(decoded):
            out[case] = {"valid": False, "error_type": "ast_decoder:no_tool_call"}
            continue
        try:
            judged = ast_checker(entry["function"], decoded, truth, Language.PYTHON, category, MODEL)
        except RecursionError:  # an answer nested past what the checker walks: this case's miss, not the stage's
            judged = {"valid": False, "error_type": "ast_checker:nested_too_deep"}
        out[case] = {"valid": bool(judged["valid"]), "error_type": None if judged["valid"] else judged.get("error_type")}
    return out


def main():
    command, asked = sys.argv[1], json.load(sys.stdin)
    if command == "cases":
        result = cases(asked["ids"])
    elif command == "score":
        result = score(asked["answers"])
    else:
        raise SystemExit(f"unknown command {command!r}")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
