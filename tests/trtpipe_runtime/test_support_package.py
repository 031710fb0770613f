"""trtpipe_runtime, the package the served models import: standard library only, one version parser, one choice
of options file, one validation of decoding inputs, one table of the portable runtime's defaults."""

from __future__ import annotations

import ast
import sys

import pytest

from plugins.runtimes import RUNTIMES
from tests.conftest import REPO
from tests.templates import template_module
from trtpipe_runtime import decoding, params, versions

PACKAGE = REPO / "trtpipe_runtime"
STUB_ONLY = {"triton_io.py": {"numpy", "triton_python_backend_utils"}}
"""Modules only a served model imports, and what the stub gives them beyond the standard library."""


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_package_imports_the_standard_library_only(path):
    tree = ast.parse(path.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    outside = names - set(sys.stdlib_module_names) - {"__future__"} - STUB_ONLY.get(path.name, set())
    lazy = {"torch", "transformers", "tensorrt_llm", "xgrammar"}  # imported inside the functions that need them
    assert not outside - lazy, f"{path.name} imports {sorted(outside - lazy)}"
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert not top & lazy, f"{path.name} imports {sorted(top & lazy)} at import time"


@pytest.mark.parametrize("text, want", [("1.2.1", (1, 2, 1)), ("1.3.0rc5", (1, 3, 0)), ("1.4", (1, 4, 0)),
                                        ("1.4.0.post1", (1, 4, 0)), ("v2", (2, 0, 0)), ("dev", (0, 0, 0))])
def test_one_version_parser(text, want):
    assert versions.release(text) == want


def test_the_options_file_of_a_release_is_the_newest_not_newer(tmp_path):
    for name in ("llm_api_options.yaml", "llm_api_options-1.4.yaml", "llm_api_options-1.6.yaml", "notes.yaml"):
        (tmp_path / name).write_text("{}\n")
    pick = {v: versions.options_file(str(tmp_path), v).rsplit("/", 1)[1]
            for v in ("1.2.1", "1.3.0rc9", "1.4.0rc4", "1.5.0", "1.6.2", None)}
    assert pick == {"1.2.1": "llm_api_options.yaml", "1.3.0rc9": "llm_api_options.yaml",
                    "1.4.0rc4": "llm_api_options-1.4.yaml", "1.5.0": "llm_api_options-1.4.yaml",
                    "1.6.2": "llm_api_options-1.6.yaml", None: "llm_api_options.yaml"}


def test_the_runtimes_releases_are_data_and_their_prose_is_derived():
    trt, llmapi, portable = RUNTIMES["trtllm"], RUNTIMES["trtllm-llmapi"], RUNTIMES["pytorch"]
    assert (trt.tensorrt_llm.first, trt.tensorrt_llm.last_minor) == ((1, 2, 1), (1, 2))
    assert (llmapi.tensorrt_llm.first, llmapi.tensorrt_llm.last_minor) == ((1, 2, 1), None)
    assert portable.tensorrt_llm is None
    assert trt.tensorrt_llm_versions.startswith("1.2.x only (")
    assert llmapi.tensorrt_llm_versions.startswith(f"{llmapi.tensorrt_llm.first_text} and later (")


BAD = [(dict(temperature=-1.0), "temperature = -1.0: must be >= 0"),
       (dict(temperature=float("nan")), "temperature = nan: must be a finite number"),
       (dict(runtime_top_k=-3), "top_k = -3: must be >= 0"),
       (dict(runtime_top_p=1.5), "top_p = 1.5: must be in [0, 1]"),
       (dict(repetition_penalty=0.0), "repetition_penalty = 0.0: must be > 0"),
       (dict(frequency_penalty=float("inf")), "frequency_penalty = inf: must be a finite number"),
       (dict(min_tokens=9), "min_tokens = 9 exceeds max_tokens = 8"),
       (dict(min_tokens=-1), "min_tokens = -1: must be >= 0")]


@pytest.mark.parametrize("inputs, message", BAD, ids=[m.split(" ")[0] for _, m in BAD])
def test_every_runtime_refuses_a_decoding_input_the_same_way(inputs, message):
    """The portable runtime's parse_params and the LLM-API runtime's request_options both validate through
    trtpipe_runtime.decoding: the same refusal, the same words."""
    get = inputs.get
    sampling = template_module("tensorrt_llm_pytorch", "sampling")
    request_params = template_module("tensorrt_llm_llmapi", "request_params")
    with pytest.raises(decoding.DecodingError) as portable:
        sampling.parse_params(get, end_ids=[2], max_new_tokens=8)
    with pytest.raises(decoding.DecodingError) as llmapi:
        request_params.request_options(get, max_new_tokens=8)
    assert message in str(portable.value) and str(portable.value) == str(llmapi.value)


@pytest.mark.parametrize("inputs, greedy", [({}, True), (dict(temperature=0.8), True),
                                            (dict(runtime_top_k=40), False), (dict(runtime_top_p=0.9), False),
                                            (dict(runtime_top_k=1, runtime_top_p=0.9), True),
                                            (dict(runtime_top_p=0.9, temperature=0.0), True)])
def test_the_greedy_rule_is_one(inputs, greedy):
    """TensorRT-LLM's rule (top_k 0 and top_p 0 mean greedy; temperature alone does not sample), for both."""
    sampling = template_module("tensorrt_llm_pytorch", "sampling")
    request_params = template_module("tensorrt_llm_llmapi", "request_params")
    assert decoding.decoding(inputs.get, max_new_tokens=8).greedy is greedy
    assert sampling.parse_params(inputs.get, end_ids=[2], max_new_tokens=8).greedy is greedy
    assert (request_params.request_options(inputs.get, max_new_tokens=8).sampling.get("top_k") == 1) is greedy


def test_the_portable_runtimes_defaults_are_one_table():
    """The registry's settings are the served model's table, and the model reads each choice through it (no default
    of its own)."""
    assert RUNTIMES["pytorch"].settings is params.PORTABLE_RUNTIME_CHOICES
    for template in ("tensorrt_llm_pytorch",):
        for path in sorted((REPO / "model_repo" / "templates" / template / "1").glob("*.py")):
            calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                     and getattr(n.func, "id", "") == "_param" and n.args[1:2]
                     and isinstance(n.args[1], ast.Constant) and n.args[1].value in params.CHOICE_DEFAULTS]
            assert not calls, f"{path.name} reads {[c.args[1].value for c in calls]} with defaults of its own"
    assert params.choice({"parameters": {}}, "engine_process") == "true"
    assert params.choice({"parameters": {"engine_process": {"string_value": "false"}}}, "engine_process") == "false"
