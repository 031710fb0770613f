"""The LLM-API options YAML (runtime trtllm-llmapi): generated from the spec and the plan, and every key checked
against the argument classes recorded from TensorRT-LLM 1.2.1 and 1.4 (tests/facts/trtllm_*/llm_args.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from builders.llmapi_options import llm_api_options, option_problems
from builders.preflight import check, make_plan
from builders.spec import load_spec
from plugins.errors import SpecError
from plugins.targets import get_target
from tests.conftest import REPO, hf_config

FACTS = {v: json.loads((REPO / "tests" / "facts" / d / "llm_args.json").read_text())
         for v, d in (("1.2.1", "trtllm_1_2_1"), ("1.4", "trtllm_1_4"))}
LLMAPI_BUILDS = sorted(p for p in (REPO / "configs" / "builds").glob("*.yaml")
                       if yaml.safe_load(p.read_text()).get("runtime") == "trtllm-llmapi")


def _facts_accept(options: dict, facts: dict) -> list[str]:
    """Keys of ``options`` the recorded argument classes do not have (checked here from the facts themselves)."""
    bad = [k for k in options if k not in facts["torch_llm_args"]]
    for key, cls in (("kv_cache_config", "kv_cache_config"), ("cuda_graph_config", "cuda_graph_config"),
                     ("scheduler_config", "scheduler_config")):
        bad += [f"{key}.{k}" for k in options.get(key) or {} if k not in facts[cls]]
    if options.get("scheduler_config"):
        policy = options["scheduler_config"]["capacity_scheduler_policy"]
        bad += [] if policy in facts["capacity_scheduler_policies"] else [f"policy {policy}"]
    return bad


@pytest.mark.parametrize("path", LLMAPI_BUILDS, ids=[p.stem for p in LLMAPI_BUILDS])
def test_generated_options_are_accepted_by_both_releases(path):
    build = load_spec(path, "h100")
    plan = make_plan(build, get_target("h100"), json.loads(Path(build.model.hf_config).read_text()))
    options = llm_api_options(build, plan)
    for version, facts in FACTS.items():
        assert _facts_accept(options, facts) == [], version
    assert option_problems(options) == []
    assert options["tensor_parallel_size"] == plan.tp_size and options["max_seq_len"] == plan.limits.max_seq_len
    assert options["kv_cache_config"]["dtype"] == ("fp8" if plan.kv_cache_quant_algo == "fp8" else "auto")
    assert max(options["cuda_graph_config"]["batch_sizes"]) == plan.limits.max_batch_size
    if plan.model.is_moe:
        assert (options["moe_tensor_parallel_size"], options["moe_expert_parallel_size"]) == \
               (plan.moe_tp_size, plan.moe_ep_size)


def _spec(tmp_path, extra: str):
    p = tmp_path / "b.yaml"
    p.write_text(f"name: b\nmodel: {{source: {tmp_path / 'absent'}}}\nruntime: trtllm-llmapi\ndtype: bfloat16\n"
                 f"quantization: {{quant_algo: fp8}}\nserving:\n  llm_api_options: {extra}\ntargets: {{h100: {{}}}}\n")
    return load_spec(p, "h100")


def _codes(tmp_path, extra):
    with pytest.raises(SpecError) as err:
        check(_spec(tmp_path, extra), get_target("h100"))
    return err.value.problems


def test_misspelt_option_names_both_releases_and_the_fix(tmp_path):
    problems = _codes(tmp_path, "{enable_chunked_prefil: true}")
    assert [p.field for p in problems] == ["serving.llm_api_options.enable_chunked_prefil"] * 2
    assert {p.rule.split("'s")[0] for p in problems} == {"TensorRT-LLM 1.2.1", "TensorRT-LLM 1.4"}
    assert "Did you mean 'enable_chunked_prefill'?" in problems[0].fix


def test_build_config_is_refused_by_the_pytorch_backend(tmp_path):
    rules = [p.rule for p in _codes(tmp_path, "{build_config: {max_batch_size: 8}}")]
    assert any("1.2.1's PyTorch backend refuses 'build_config'" in r for r in rules)
    assert any("1.4's LLM API has no option 'build_config'" in r for r in rules)


def test_an_option_one_release_lacks_names_that_release(tmp_path):
    # enable_sleep is 1.2.1's; 1.4 replaced it with sleep_config
    problems = _codes(tmp_path, "{enable_sleep: true}")
    assert [p.rule for p in problems] == ["TensorRT-LLM 1.4's LLM API has no option 'enable_sleep'"]


def test_nested_keys_are_checked_and_user_values_win(tmp_path):
    problems = _codes(tmp_path, "{kv_cache_config: {host_cache_sise: 1000}}")
    assert problems[0].field == "serving.llm_api_options.kv_cache_config.host_cache_sise"
    build = _spec(tmp_path, "{kv_cache_config: {host_cache_size: 4000000000}, max_num_tokens: 2048}")
    check(build, get_target("h100"))  # accepted by both releases
    options = llm_api_options(build)
    assert options["kv_cache_config"]["host_cache_size"] == 4000000000 and options["max_num_tokens"] == 2048
    assert options["kv_cache_config"]["free_gpu_memory_fraction"] == build.settings.serving.kv_cache_free_gpu_mem_fraction


def test_llmapi_repository_carries_the_options_yaml(tmp_path):
    from model_repo.generate import plan_repository, write_repository
    from tests.conftest import smollm2_tokenizer_dir

    build = _spec(tmp_path, "{enable_iter_perf_stats: true}")
    plan = make_plan(build, get_target("h100"), hf_config("qwen3-30b-a3b"))
    repo = plan_repository(build, get_target("h100"), plan, tmp_path / "engine", tokenizer_dir=smollm2_tokenizer_dir(),
                           engine_built=False)
    write_repository(repo, tmp_path / "repo")
    text = (tmp_path / "repo" / "tensorrt_llm" / "1" / "llm_api_options.yaml").read_text()
    assert text.startswith("# LLM-API options of build b") and yaml.safe_load(text) == llm_api_options(build, plan)
    assert yaml.safe_load(text)["moe_expert_parallel_size"] == 1 and yaml.safe_load(text)["enable_iter_perf_stats"]
    # config.pbtxt shows what the options file gives tensorrt_llm.LLM, not the engine path's default
    llm = next(m for m in repo.models if m.name == "tensorrt_llm")
    assert llm.values["enable_kv_cache_reuse"] == "true" and "llm_api_options.yaml" in llm.sources["enable_kv_cache_reuse"]


def test_kv_cache_reuse_follows_the_llm_api_default_unless_the_spec_says(tmp_path):
    """KvCacheConfig.enable_block_reuse defaults to true in both recorded releases; the spec's explicit word wins."""
    for version, facts in FACTS.items():
        assert facts["kv_cache_config"]["enable_block_reuse"]["default"] is True, version
    assert llm_api_options(_spec(tmp_path, "{}"))["kv_cache_config"]["enable_block_reuse"] is True
    p = tmp_path / "off.yaml"
    p.write_text(f"name: b\nmodel: {{source: {tmp_path}}}\nruntime: trtllm-llmapi\nserving: {{enable_kv_cache_reuse: "
                 "false}\ntargets: {h100: {}}\n")
    assert llm_api_options(load_spec(p, "h100"))["kv_cache_config"]["enable_block_reuse"] is False
