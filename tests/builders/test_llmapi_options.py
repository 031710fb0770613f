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
from tests.conftest import REPO, hf_config, smollm2_tokenizer_dir

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


# --- speculative decoding, guided decoding, host KV offload ---------------------------------------------------

EAGLE3_DRAFT = {  # the shape of an EAGLE-3 head for Llama-3.1-8B (one decoder layer, a 32000-token draft vocabulary)
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
    "vocab_size": 128256, "draft_vocab_size": 32000, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072, "rope_theta": 500000.0}


def _served(tmp_path, serving: str, runtime: str = "trtllm-llmapi", name: str = "b.yaml", more: str = ""):
    p = tmp_path / name
    p.write_text(f"name: b\nmodel: {{source: {tmp_path / 'absent'}}}\nruntime: {runtime}\ndtype: bfloat16\n"
                 f"quantization: {{quant_algo: fp8}}\n{more}serving:\n{serving}\ntargets: {{h100: {{}}}}\n")
    return load_spec(p, "h100")


def _problems(build, cfg=None):
    with pytest.raises(SpecError) as err:
        make_plan(build, get_target("h100"), cfg or hf_config("llama-3.1-8b"))
    return {p.code: p for p in err.value.problems}


def _spec_fields(facts: dict, decoding_type: str) -> set:
    """speculative_config keys a release's facts allow for one decoding_type (base fields, aliases, own fields)."""
    spec = facts["speculative"]
    base = spec["DecodingBaseConfig"]["fields"]
    keys = set(base) | {a for f in base.values() for a in f.get("aliases", [])} | {"decoding_type"}
    entry = next(e for e in spec.values() if isinstance(e, dict) and e.get("decoding_type") == decoding_type)
    own = set(entry["fields"]) - {"<all EagleDecodingConfig fields>"}
    if "<all EagleDecodingConfig fields>" in entry["fields"]:
        own |= set(spec["EagleDecodingConfig"]["fields"])
    return keys | own


@pytest.mark.parametrize("mode,draft", [("eagle3", "/models/eagle3-llama3.1-8b"), ("draft_target", "/models/llama-1b"),
                                        ("ngram", None)])
def test_speculative_config_is_spelt_for_each_release(tmp_path, mode, draft):
    line = f"    draft_model: {draft}\n" if draft else ""
    build = _served(tmp_path, f"  speculative_decoding:\n    mode: {mode}\n    max_draft_len: 4\n{line}")
    expected = {"eagle3": {"1.2.1": "Eagle", "1.4": "Eagle3"}, "draft_target": {"1.2.1": "DraftTarget",
                "1.4": "Draft_Target"}, "ngram": {"1.2.1": "NGram", "1.4": "NGram"}}[mode]
    for release, facts in FACTS.items():
        spec = llm_api_options(build, release=release)["speculative_config"]
        assert spec["decoding_type"] == expected[release] and spec["max_draft_len"] == 4
        # each key is one the release's recorded DecodingBaseConfig subclass has
        assert set(spec) <= _spec_fields(facts, spec["decoding_type"]), (release, spec)
        assert option_problems(llm_api_options(build, release=release), releases=[release]) == []
        if draft:  # the draft's key: speculative_model_dir in 1.2.1, speculative_model (its new name) in 1.4
            assert spec["speculative_model_dir" if release == "1.2.1" else "speculative_model"] == draft
    if mode == "draft_target":  # 1.2.1's spelling is refused by 1.4, naming it
        old = llm_api_options(build, release="1.2.1")
        bad = option_problems(old, releases=["1.4"])
        assert [p.field for p in bad] == ["serving.llm_api_options.speculative_config.decoding_type"]
        assert "1.4" in bad[0].rule and "Draft_Target" in bad[0].rule
    check(build, get_target("h100"))  # the spec's own rules pass


def test_one_options_file_unless_a_release_spells_it_differently(tmp_path):
    from builders.llmapi_options import options_files

    ngram = _served(tmp_path, "  speculative_decoding: {mode: ngram}\n  guided_decoding_backend: xgrammar\n")
    files = options_files(ngram)
    assert list(files) == ["llm_api_options.yaml"] and "TensorRT-LLM 1.2.1, 1.4" in files["llm_api_options.yaml"]
    assert yaml.safe_load(files["llm_api_options.yaml"])["guided_decoding_backend"] == "xgrammar"
    eagle = _served(tmp_path, "  speculative_decoding: {mode: eagle3, draft_model: /d}\n", name="e.yaml")
    files = options_files(eagle)
    assert list(files) == ["llm_api_options.yaml", "llm_api_options-1.4.yaml"]
    assert yaml.safe_load(files["llm_api_options-1.4.yaml"])["speculative_config"]["decoding_type"] == "Eagle3"


def test_speculative_rules(tmp_path):
    no_draft = _problems(_served(tmp_path, "  speculative_decoding: {mode: eagle3}\n"))
    assert no_draft["speculative_draft"].field == "serving.speculative_decoding.draft_model"
    ngram_draft = _problems(_served(tmp_path, "  speculative_decoding: {mode: ngram, draft_model: /d}\n", name="n.yaml"))
    assert "takes no draft model" in ngram_draft["speculative_draft"].rule
    mtp = _problems(_served(tmp_path, "  speculative_decoding: {mode: mtp}\n", name="m.yaml"))
    assert "no MTP layers" in mtp["speculative_mtp"].rule
    assert "speculative_mtp" not in _codes_of(tmp_path, "  speculative_decoding: {mode: mtp}\n",
                                              {**hf_config("llama-3.1-8b"), "num_nextn_predict_layers": 1})
    for runtime in ("pytorch", "trtllm"):
        p = _problems(_served(tmp_path, "  speculative_decoding: {mode: ngram}\n  guided_decoding_backend: xgrammar\n",
                              runtime=runtime, name=f"{runtime}.yaml"))
        assert p["llmapi_feature"].field == "serving.speculative_decoding"
        assert "guided_backend_runtime" not in p  # xgrammar: every runtime has it
        p = _problems(_served(tmp_path, "  guided_decoding_backend: llguidance\n", runtime=runtime,
                              name=f"{runtime}-llg.yaml"))
        assert p["guided_backend_runtime"].field == "serving.guided_decoding_backend"
        assert "set serving.guided_decoding_backend: xgrammar" in p["guided_backend_runtime"].fix
    make_plan(_served(tmp_path, "  guided_decoding_backend: llguidance\n", name="llg.yaml"), get_target("h100"),
              hf_config("llama-3.1-8b"))  # the LLM API has llguidance: no problem
    host = _problems(_served(tmp_path, "  kv_cache_host_memory_bytes: 1000000\n", runtime="pytorch", name="h.yaml"))
    assert host["kv_host_cache_runtime"].value == 1000000


def _codes_of(tmp_path, serving, cfg):
    try:
        make_plan(_served(tmp_path, serving, name="c.yaml"), get_target("h100"), cfg)
    except SpecError as err:
        return {p.code for p in err.problems}
    return set()


def test_draft_target_needs_the_same_vocabulary(tmp_path):
    small = {**hf_config("llama-3.2-1b")}
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text(json.dumps({**small, "vocab_size": 32000}))
    build = _served(tmp_path, f"  speculative_decoding: {{mode: draft_target, draft_model: {tmp_path / 'draft'}}}\n")
    assert "vocab_size 32000 differs" in _problems(build)["speculative_vocab"].rule
    (tmp_path / "draft" / "config.json").write_text(json.dumps(small))
    plan = make_plan(build, get_target("h100"), hf_config("llama-3.1-8b"))
    assert plan.speculative.draft_source.endswith("config.json") and plan.speculative.draft_weights_bytes > 2e9


def test_the_plan_counts_the_eagle3_draft(tmp_path):
    (tmp_path / "eagle3.json").write_text(json.dumps(EAGLE3_DRAFT))
    base = make_plan(_served(tmp_path, "  streaming: true\n", name="base.yaml"), get_target("h100"),
                     hf_config("llama-3.1-8b"))
    build = _served(tmp_path, "  speculative_decoding:\n    mode: eagle3\n    draft_model: /gpu-host/eagle3\n"
                              f"    draft_hf_config: {tmp_path / 'eagle3.json'}\n")
    plan = make_plan(build, get_target("h100"), hf_config("llama-3.1-8b"))
    # EAGLE-3 head layout (SGLang llama_eagle3.py): q/k/v read 2 x hidden, o, gate/up/down, three norms; the fc over
    # three hidden-state taps, a final norm, lm_head over the draft vocabulary; no embedding (the target's). bf16.
    h, kv, inter, dv = 4096, 8 * 128, 14336, 32000
    layer = 2 * h * (h + 2 * kv) + h * h + 3 * h * inter + 3 * h
    draft = 2 * (layer + 3 * h * h + h + dv * h)
    # 424.7M parameters, 0.85 GB: about the size of the published Llama-3.1-8B EAGLE-3 heads
    sp = plan.speculative
    assert (sp.mode, sp.tokens_per_step, sp.draft_weights_bytes) == ("eagle3", 4, draft)
    assert sp.draft_kv_bytes_per_token == 2 * 1 * 8 * 128 * 2  # K and V of its one layer, bf16
    assert plan.memory.kv.bytes_per_token == base.memory.kv.bytes_per_token + sp.draft_kv_bytes_per_token
    assert plan.memory.free_bytes_after_weights_and_activations == \
        base.memory.free_bytes_after_weights_and_activations - draft
    assert plan.memory.total_bytes >= base.memory.total_bytes - 2**20


def test_unreadable_draft_is_a_warning_and_big_batches_ask_for_max_concurrency(tmp_path):
    build = _served(tmp_path, "  speculative_decoding: {mode: eagle3, draft_model: /gpu-host/eagle3}\n",
                    more="limits: {max_batch_size: 64, max_num_tokens: 128, max_input_len: 64}\n")
    plan = make_plan(build, get_target("h100"), hf_config("llama-3.1-8b"))
    assert plan.speculative.draft_weights_bytes == 0
    assert any(w.startswith("draft memory not counted") for w in plan.warnings)
    assert any("max_concurrency" in w for w in plan.warnings)  # max_batch_size 64 > 16
    # 64 requests x (1 + 3 draft tokens) = 256 > max_num_tokens 128: at most 32 requests a step
    assert any("runs at most 32 of 64 drafting requests" in w for w in plan.warnings)
    # drafting stops above max_concurrency: 16 x 4 + 4080 x 1 tokens fit 8192, no budget warning for 4096 requests
    capped = _served(tmp_path, "  speculative_decoding: {mode: ngram, max_concurrency: 16}\n", name="c.yaml",
                     more="limits: {max_batch_size: 4096, max_num_tokens: 8192, max_input_len: 64}\n")
    assert not [w for w in make_plan(capped, get_target("h100"), hf_config("llama-3.1-8b")).warnings
                if "max_num_tokens" in w]
    small = _served(tmp_path, "  speculative_decoding: {mode: ngram, max_concurrency: 8}\n", name="s.yaml",
                    more="limits: {max_batch_size: 64, max_num_tokens: 256, max_input_len: 64}\n")
    assert not [w for w in make_plan(small, get_target("h100"), hf_config("llama-3.1-8b")).warnings
                if "speculative" in w or "draft" in w]


def test_host_kv_cache_reaches_both_tensorrt_llm_runtimes(tmp_path):
    from model_repo.generate import plan_repository

    build = _served(tmp_path, "  kv_cache_host_memory_bytes: 8000000000\n")
    assert llm_api_options(build)["kv_cache_config"]["host_cache_size"] == 8_000_000_000
    assert option_problems(llm_api_options(build)) == []
    engine = _served(tmp_path, "  kv_cache_host_memory_bytes: 8000000000\n", runtime="trtllm", name="t.yaml")
    plan = make_plan(engine, get_target("h100"), hf_config("llama-3.1-8b"))
    repo = plan_repository(engine, get_target("h100"), plan, tmp_path / "engine", engine_built=False,
                           tokenizer_dir=smollm2_tokenizer_dir())
    llm = next(m for m in repo.models if m.name == "tensorrt_llm")
    assert llm.values["kv_cache_host_memory_bytes"] == "8000000000"


def test_attention_dp_is_written_where_both_releases_take_it(tmp_path):
    """parallelism.enable_attention_dp -> the options' ``enable_attention_dp`` (a BaseLlmArgs bool in both recorded
    releases), beside the expert split it keeps; off, the key is left to the LLM API's default (false)."""
    src = (REPO / "configs" / "builds" / "qwen3-30b-a3b.yaml").read_text().replace("../../", str(REPO) + "/")
    cfg = hf_config("qwen3-30b-a3b")
    for on in (True, False):
        p = tmp_path / f"q{on}.yaml"
        p.write_text(src.replace("  tp_size: 1\n", f"  tp_size: 4\n  moe_ep_size: 4\n  enable_attention_dp: {on}\n"))
        build = load_spec(p, "h200")
        options = llm_api_options(build, make_plan(build, get_target("h200"), cfg))
        assert options.get("enable_attention_dp") is (True if on else None)
        assert (options["tensor_parallel_size"], options["moe_expert_parallel_size"]) == (4, 4)
        for version, facts in FACTS.items():
            assert _facts_accept(options, facts) == [], version
            assert facts["torch_llm_args"]["enable_attention_dp"]["type"] == "bool"
