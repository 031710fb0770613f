"""Generated `trtllm` repositories and trtllm-build command lines, held to TensorRT-LLM 1.2.1's own facts.

The facts (tests/facts/trtllm_1_2_1/*.json) were recorded from the upstream sources the NGC container
tritonserver:26.07-trtllm-python-py3 is built from (TensorRT-LLM triton_backend model_state.cc /
model_instance_state.cc / utils.{h,cc}, the all_models/inflight_batcher_llm templates, commands/build.py,
plugin/plugin.py, builder.py; commits in each file's "source"). TensorRT-LLM cannot run here, so what it
would refuse is checked against what it reads: every key the C++ backend reads without a fallback is
present, every key we write is one it reads, with a value it parses; every tensor carries the name,
dtype and dims upstream's templates give it; every trtllm-build flag and value is one the real parser
accepts. Builds cover several quantizations and tp x pp up to 16 GPUs over 2 nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from builders.engine_trtllm import trtllm_build_argv
from model_repo.generate import PERF_OUTPUTS, plan_repository, write_repository
from builders.plan import plugin_decisions
from pipeline.client import PERF_NAMES
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import write_spec

FACTS = Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1"


def facts(name: str) -> dict:
    return json.loads((FACTS / f"{name}.json").read_text())


BACKEND = facts("backend_parameters")
TEMPLATES = facts("model_templates")["models"]
PERF = facts("perf_outputs")
INPUTS_READ = {i["name"]: i for i in facts("inputs_read")["inputs"]}
BUILD_FLAGS = {**facts("trtllm_build")["flags"], **facts("trtllm_build")["plugin_flags"]}

# (target, quant_algo, kv_cache_quant_algo, tp, pp, num_nodes): the quantizations and layouts built for GPUs
BUILDS = [("h100", "none", None, 1, 1, 1), ("h100", "fp8", "fp8", 2, 1, 1), ("h100", "int4_awq", None, 1, 2, 1),
          ("h100", "fp8", None, 8, 2, 2), ("a10", "int4_awq", None, 2, 1, 1), ("l40s", "w4a8_awq", None, 4, 1, 1),
          ("h200", "int8_sq", None, 2, 2, 1), ("b200", "fp8", "fp8", 4, 4, 2)]
IDS = [f"{t}-{q}{'+kv' if kv else ''}-tp{tp}pp{pp}-{n}node" for t, q, kv, tp, pp, n in BUILDS]
# Outputs of ours that upstream's models do not have, or have with other dims, on purpose (README "interface").
OURS = {"num_output_tokens": "tokens carried by each response, counted by the server (upstream's num_output_tokens "
                             "[1] is only sent with return_num_output_tokens)",
        "NUM_OUTPUT_TOKENS": "postprocessing's count behind num_output_tokens",
        "stop_strings": "tensorrt_llm_bls only: stop strings matched on the decoded text (upstream's stop_words are "
                        "token ids, kept as they are)",
        "output_token_ids": "tensorrt_llm_bls only, sent when asked for by name: the token ids of each response's "
                            "text, which output_log_probs and context_logits score (the OpenAI frontend's logprobs)"}
# Inputs upstream makes optional that ours require, on purpose.
REQUIRED_HERE = {"input_ids": "decoder-only models need the prompt (upstream allows encoder features instead)"}


def _dims(value) -> list[int]:
    return [int(d) for d in value]


@pytest.fixture(scope="module")
def repositories(tiny_llama, tmp_path_factory) -> dict:
    """The `trtllm` repository of each build in BUILDS (as the GPU-host bundle writes it), parsed, and its argv."""
    out = {}
    for ident, (target, quant, kv, tp, pp, nodes) in zip(IDS, BUILDS):
        tmp = tmp_path_factory.mktemp(ident)
        kv_line = f", kv_cache_quant_algo: {kv}" if kv else ""
        spec = write_spec(tmp / "b.yaml", tiny_llama, target=target, quant=quant, extra=(
            f"    parallelism: {{tp_size: {tp}, pp_size: {pp}, num_nodes: {nodes}}}\n"
            f"    quantization: {{quant_algo: {quant}{kv_line}}}\n"))
        build = load_spec(spec, target)
        tgt = get_target(target)
        plan = plan_repository(build, tgt, None, tmp / "engine", engine_built=False, tokenizer_dir=tiny_llama,
                               sys_path=[])
        configs = write_repository(plan, tmp / "model_repo")
        argv = trtllm_build_argv(checkpoint_dir=tmp / "ckpt", output_dir=tmp / "engine", limits=build.limits,
                                 plugins=plugin_decisions(build, tgt.sm, "LlamaForCausalLM"), world_size=tp * pp,
                                 gpus_available=8)
        out[ident] = {"build": build, "target": tgt, "plan": plan.as_dict(),
                      "configs": {n: json_format.MessageToDict(c, preserving_proto_field_name=True)
                                  for n, c in configs.items()}, "argv": argv}
    return out


@pytest.fixture(params=IDS)
def repo(request, repositories):
    return repositories[request.param]


def _parse(kind: str, value: str):
    """Parse ``value`` as the backend does (backend_parameters.json "parsing"); raise ValueError if it cannot."""
    if kind in ("int", "uint64"):
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        if value not in ("True", "true", "TRUE", "1", "False", "false", "FALSE", "0"):
            raise ValueError(value)
        return value.lower() in ("true", "1")
    if kind == "int_list":
        return [int(x) for x in value.split(",")]
    return value


def test_tensorrt_llm_parameters_are_the_ones_the_backend_reads_with_values_it_parses(repo):
    params = {k: v.get("string_value", "") for k, v in repo["configs"]["tensorrt_llm"]["parameters"].items()}
    known = BACKEND["parameters"]
    missing = [k for k, f in known.items() if f.get("required") and k not in params]
    assert not missing, f"the backend reads {missing} with no fallback: the model would not load"
    unknown = sorted(set(params) - set(known))
    assert not unknown, f"keys the 1.2.1 backend never reads (misspelt or stale): {unknown}"
    for key, value in params.items():
        fact = known[key]
        if fact.get("required") or value != "":  # an optional key may be left empty: the backend's default
            _parse(fact["type"], value)
        values = fact.get("values")
        if isinstance(values, dict) and not fact.get("required"):
            assert value in {v for v in values if " " not in v and "$" not in v}, (key, value, list(values))
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["decoding_mode"] in BACKEND["parameters"]["decoding_mode"]["values"]


def test_limits_come_from_the_spec_and_match_the_argv(repo):
    """Each limit in the configs names the spec field it came from, and trtllm-build is asked for the same
    value (one limits object from the spec to config.pbtxt and the argv)."""
    comments = json.dumps(repo["plan"])
    assert "spec: limits.max_batch_size" in comments and "engine.json" not in comments
    argv = repo["argv"]
    flags = dict(zip(argv[1::2], argv[2::2]))
    pre = repo["configs"]["preprocessing"]["parameters"]
    assert flags["--max_input_len"] == pre["max_input_len"]["string_value"]
    assert flags["--max_seq_len"] == pre["max_seq_len"]["string_value"]


def test_gpu_device_ids_are_node_local(repo):
    """WorldConfig (worldConfig.cpp, 1.x): ids must be unique, below gpus_per_node, at most gpus_per_node."""
    params = repo["configs"]["tensorrt_llm"]["parameters"]
    par = repo["build"].settings.parallelism
    gpn = par.gpus_per_node or repo["target"].gpus_per_node
    ids = [int(x) for x in params["gpu_device_ids"]["string_value"].split(",")]
    assert len(ids) <= gpn and max(ids) < gpn and min(ids) >= 0 and len(set(ids)) == len(ids)
    assert len(ids) == min(par.tp_size * par.pp_size, gpn)
    ranks = [int(x) for x in params["participant_ids"]["string_value"].split(",")]
    assert ranks == list(range(par.tp_size * par.pp_size))  # MPI ranks stay global


def _tensors(model: dict, kind: str) -> dict:
    return {t["name"]: t for t in model.get(kind, [])}


def _check_against_upstream(ours: dict, upstream: dict, name: str) -> None:
    theirs_in = {t["name"]: t for t in upstream["inputs"]}
    theirs_out = {t["name"]: t for t in upstream["outputs"]}
    for t in ours.get("input", []):
        if t["name"] in OURS:
            continue
        up = theirs_in.get(t["name"])
        assert up is not None, f"{name}: input {t['name']} is not an input of upstream's {name}"
        if not up["data_type"].startswith("${"):
            assert t["data_type"] == up["data_type"], (name, t["name"], t["data_type"], up["data_type"])
        assert _dims(t["dims"]) == up["dims"], (name, t["name"], t["dims"], up["dims"])
        if up.get("optional") and t["name"] not in REQUIRED_HERE:
            assert t.get("optional"), f"{name}: {t['name']} is optional upstream, so clients may leave it out"
    for t in ours.get("output", []):
        if t["name"] in OURS:
            continue
        up = theirs_out.get(t["name"])
        assert up is not None, f"{name}: output {t['name']} is not an output of upstream's {name}"
        if not up["data_type"].startswith("${"):
            assert t["data_type"] == up["data_type"], (name, t["name"], t["data_type"], up["data_type"])
        assert _dims(t["dims"]) == up["dims"], (name, t["name"], t["dims"], up["dims"])


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls"])
def test_every_tensor_has_upstreams_name_dtype_and_dims(repo, model):
    _check_against_upstream(repo["configs"][model], TEMPLATES[model], model)


def test_every_input_of_tensorrt_llm_is_read_by_the_backend(repo):
    """An input the backend does not read would be accepted and silently ignored (the old random_seed)."""
    for t in repo["configs"]["tensorrt_llm"]["input"]:
        assert t["name"] in INPUTS_READ, f"the 1.2.1 backend never reads input {t['name']}"
        assert INPUTS_READ[t["name"]]["template_data_type"] == t["data_type"], t["name"]


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble", "tensorrt_llm_bls"])
def test_every_perf_output_the_backend_writes_is_declared_with_its_dtype(repo, model):
    """With return_perf_metrics the backend writes all of them; Triton fails a response holding an output the
    config lacks ("unexpected inference output"), so a missing one breaks every such request."""
    assert PERF["written_unconditionally_once_flag_set"] is True
    declared = _tensors(repo["configs"][model], "output")
    for out in PERF["perf_outputs"]:
        assert out["name"] in declared, f"{model} lacks perf output {out['name']}"
        assert declared[out["name"]]["data_type"] == out["data_type"], out["name"]
        assert _dims(declared[out["name"]]["dims"]) == out["dims"], out["name"]


def test_the_ensemble_maps_what_upstreams_ensemble_maps(repo):
    ours = {s["model_name"]: s for s in repo["configs"]["ensemble"]["ensemble_scheduling"]["step"]}
    for step in TEMPLATES["ensemble"]["steps"]:
        mine = ours[step["model_name"]]
        for key, value in mine.get("input_map", {}).items():  # each client tensor lands where upstream puts it
            assert step["input_map"].get(key) == value, (step["model_name"], key, value)
        for key, value in mine.get("output_map", {}).items():
            if key not in OURS:
                assert step["output_map"].get(key) == value, (step["model_name"], key, value)


def test_tables_and_client_agree_with_the_perf_facts():
    names = [o["name"] for o in PERF["perf_outputs"]]
    assert sorted(p.runtime_name for p in PERF_OUTPUTS) == sorted(names) == sorted(PERF_NAMES)
    assert {p.runtime_name: p.data_type for p in PERF_OUTPUTS} == {o["name"]: o["data_type"] for o in PERF["perf_outputs"]}


def check_trtllm_build_argv(argv: list[str]) -> None:
    """Raise AssertionError for a flag or value trtllm-build 1.2 would refuse (trtllm_build.json)."""
    i = 1
    while i < len(argv):
        flag = argv[i]
        fact = BUILD_FLAGS.get(flag)
        assert fact is not None, f"trtllm-build 1.2 has no flag {flag}"
        assert not fact.get("deprecated"), f"{flag} is deprecated in 1.2"
        if fact["type"] == "store_true":
            i += 1
            continue
        value = argv[i + 1]
        if fact.get("choices"):
            got = value.lower() if fact.get("case_insensitive") else value
            assert got in [str(c).lower() if fact.get("case_insensitive") else str(c) for c in fact["choices"]], \
                (flag, value, fact["choices"])
        elif fact["type"] == "int":
            assert value.lstrip("-").isdigit(), (flag, value, "argparse type=int")
        i += 2


def test_trtllm_build_argv_uses_only_flags_and_values_the_real_parser_accepts(repo):
    check_trtllm_build_argv(repo["argv"])
    pairs = dict(zip(repo["argv"][1::2], repo["argv"][2::2]))
    par = repo["build"].settings.parallelism
    assert int(pairs["--workers"]) == min(par.tp_size * par.pp_size, 8)


def test_the_argv_checker_refuses_what_trtllm_build_refuses():
    base = ["trtllm-build", "--checkpoint_dir", "c"]
    check_trtllm_build_argv(base + ["--kv_cache_type", "PAGED"])  # KVCacheType.from_string upper-cases
    for bad in (["--paged_context_fmha", "enable"], ["--gemm_plugin", "int8"], ["--max_batch_size", "eight"],
                ["--use_fp8_context_fmha", "Enable"]):
        with pytest.raises(AssertionError):
            check_trtllm_build_argv(base + bad)
