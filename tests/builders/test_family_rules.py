"""The family rules, on the stored config.json of real models (tests/assets) and nothing else: refusals name the
field, the value and what to do, in ``trtpipe plan`` as in ``trtpipe build``, before any weight is read."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from builders.preflight import make_plan
from builders.spec import load_spec
from plugins.errors import SpecError
from plugins.targets import get_target
from tests.conftest import REPO, hf_config


def _spec(tmp_path, *, runtime="trtllm-llmapi", quant="fp8", parallelism="", target="h100", kv=""):
    p = tmp_path / "b.yaml"
    p.write_text(f"name: b\nmodel: {{source: {tmp_path / 'absent'}}}\nruntime: {runtime}\ndtype: bfloat16\n"
                 f"quantization: {{quant_algo: {quant}{kv}}}\nparallelism: {{{parallelism}}}\n"
                 f"limits: {{max_seq_len: 4096, max_input_len: 2048, max_num_tokens: 4096}}\n"
                 f"targets: {{{target}: {{}}}}\n")
    return load_spec(p, target)


def _problems(build, cfg, target="h100"):
    with pytest.raises(SpecError) as err:
        make_plan(build, get_target(target), cfg)
    return {p.code: p for p in err.value.problems}


def test_trtllm_is_refused_for_gemma_naming_the_runtimes_that_build_it(tmp_path):
    p = _problems(_spec(tmp_path, runtime="trtllm"), hf_config("gemma-3-1b"))["family_runtime"]
    assert p.field == "runtime" and p.value == "trtllm"
    assert "ModelOpt 0.47" in p.rule and "trtllm-llmapi" in p.fix and "pytorch" in p.fix


def test_gemma2_has_only_the_portable_runtime(tmp_path):
    p = _problems(_spec(tmp_path, runtime="trtllm-llmapi"), hf_config("gemma-2-9b"))["family_runtime"]
    assert "registers no Gemma2ForCausalLM" in p.rule and p.fix == "use runtime: pytorch"


def test_moe_int4_is_refused_naming_the_quantizations_that_work(tmp_path):
    p = _problems(_spec(tmp_path, quant="int4_awq"), hf_config("mixtral-8x7b"))["family_quant"]
    assert p.field == "quantization.quant_algo" and p.value == "int4_awq"
    assert "fused experts" in p.rule and p.fix == "use quant_algo: none | fp8 | int8_sq"  # H100 has no FP4
    b200 = _problems(_spec(tmp_path, quant="int4_awq", target="b200"), hf_config("mixtral-8x7b"), "b200")
    assert b200["family_quant"].fix == "use quant_algo: none | fp8 | int8_sq | nvfp4"


def test_experts_not_divisible_by_moe_ep_size(tmp_path):
    # Qwen3-30B-A3B: 128 experts of intermediate 768; tp 6 = moe_tp 2 x moe_ep 3, and 128 % 3 != 0
    build = _spec(tmp_path, parallelism="tp_size: 6, moe_ep_size: 3, gpus_per_node: 8", target="h200")
    p = _problems(build, hf_config("qwen3-30b-a3b"), "h200")["experts_ep"]
    assert p.field == "parallelism.moe_ep_size" and p.value == 3 and "num_experts (128)" in p.rule
    assert p.fix == "use (moe_tp_size, moe_ep_size) in (3, 2), (6, 1)"


def test_moe_sizes_must_multiply_to_tp(tmp_path):
    build = _spec(tmp_path, parallelism="tp_size: 4, moe_tp_size: 1, moe_ep_size: 2", target="h200")
    p = _problems(build, hf_config("qwen3-30b-a3b"), "h200")["moe_sizes"]
    assert "1 x 2 must equal tp_size 4" in p.rule and "(1, 4)" in p.fix


def test_expert_parallel_plan_holds_a_share_of_the_experts(tmp_path):
    cfg = hf_config("qwen3-30b-a3b")
    whole = make_plan(_spec(tmp_path, parallelism="tp_size: 2", target="h200"), get_target("h200"), cfg)
    ep = make_plan(_spec(tmp_path, parallelism="tp_size: 2, moe_ep_size: 2", target="h200"), get_target("h200"), cfg)
    assert (whole.moe_tp_size, whole.moe_ep_size) == (2, 1) and (ep.moe_tp_size, ep.moe_ep_size) == (1, 2)
    # the same weight bytes per rank either way (1/2 of each of 128 experts, or all of 64); only the per-expert
    # FP8 scales differ (64 experts' scalars instead of 128)
    assert whole.memory.weights_breakdown["layers"] == ep.memory.weights_breakdown["layers"]
    assert ep.memory.weights_breakdown["scales"] < whole.memory.weights_breakdown["scales"]
    assert ep.memory.params_total == whole.memory.params_total
    assert 3.2e9 < ep.memory.params_active < 3.5e9 and 30.4e9 < ep.memory.params_total < 30.6e9  # "A3B", 30.5B


def test_dense_model_with_expert_parallelism_is_refused(tmp_path):
    p = _problems(_spec(tmp_path, parallelism="tp_size: 2, moe_ep_size: 2"), hf_config("qwen2.5-7b"))["moe_sizes"]
    assert p.field == "parallelism.moe_ep_size" and "dense" in p.rule


def test_attention_dp_holds_attention_whole_and_a_pool_per_rank(tmp_path):
    # Qwen3-30B-A3B (32 heads, 4 KV heads) at tp 4, experts split 4 ways: attention DP keeps attention, the
    # embeddings and the LM head whole on each rank (more weight bytes, the whole KV heads per token) while the
    # experts stay split; every rank has its own pool, so the instance holds 4 ranks' sequences
    cfg, h200 = hf_config("qwen3-30b-a3b"), get_target("h200")
    tp = make_plan(_spec(tmp_path, parallelism="tp_size: 4, moe_ep_size: 4", target="h200"), h200, cfg)
    dp = make_plan(_spec(tmp_path, parallelism="tp_size: 4, moe_ep_size: 4, enable_attention_dp: true",
                         target="h200"), h200, cfg)
    assert (tp.serving_tp, tp.attention_dp_size) == (4, 1) and (dp.serving_tp, dp.attention_dp_size) == (1, 4)
    assert (dp.moe_tp_size, dp.moe_ep_size) == (1, 4)
    assert dp.memory.kv.kv_heads_per_rank == 4 and tp.memory.kv.kv_heads_per_rank == 1
    assert dp.memory.kv.bytes_per_token == 4 * tp.memory.kv.bytes_per_token
    assert dp.memory.weights_bytes_per_rank > tp.memory.weights_bytes_per_rank
    per_seq = -(-(128 + 128) // dp.limits.tokens_per_block)
    assert dp.memory.kv.workload_sequences == 4 * (dp.memory.kv.blocks // per_seq)
    assert dp.memory.kv.workload_concurrency == 4 * min(dp.limits.max_batch_size, dp.memory.kv.workload_sequences // 4)


def test_attention_dp_rules(tmp_path):
    cfg = hf_config("qwen3-30b-a3b")
    p = _problems(_spec(tmp_path, parallelism="tp_size: 2, enable_attention_dp: true"), hf_config("qwen2.5-7b"))
    assert p["attention_dp"].field == "parallelism.enable_attention_dp" and "dense" in p["attention_dp"].rule
    p = _problems(_spec(tmp_path, parallelism="tp_size: 1, enable_attention_dp: true"), cfg)["attention_dp"]
    assert "tp_size is 1" in p.rule and "tp_size above 1" in p.fix
    p = _problems(_spec(tmp_path, runtime="pytorch", quant="none", parallelism="tp_size: 2, enable_attention_dp: "
                        "true"), cfg)["attention_dp"]
    assert "only trtllm-llmapi" in p.rule and "runtime: trtllm-llmapi" in p.fix
    # the one switch is the spec's: the LLM-API options may not set it behind the plan's back
    path = tmp_path / "o.yaml"
    path.write_text(f"name: b\nmodel: {{source: {tmp_path / 'absent'}}}\nruntime: trtllm-llmapi\n"
                    "parallelism: {tp_size: 2}\nserving: {llm_api_options: {enable_attention_dp: true}}\n"
                    "targets: {h100: {}}\n")
    p = _problems(load_spec(path, "h100"), cfg)["attention_dp"]
    assert p.field == "serving.llm_api_options.enable_attention_dp" and "parallelism.enable_attention_dp" in p.fix


def test_unknown_rope_type_is_refused_before_any_weight_is_read(tmp_path):
    cfg = hf_config("llama-3.1-8b")
    cfg["rope_scaling"] = dict(cfg["rope_scaling"], rope_type="ntk-by-parts-2")
    p = _problems(_spec(tmp_path), cfg)["rope_type"]
    assert p.field == "model.source" and "'ntk-by-parts-2'" in p.rule and "ROPE_TYPES" in p.fix


def test_rope_type_another_family_uses_is_refused(tmp_path):
    cfg = dict(hf_config("qwen2.5-7b"), rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert "Qwen2/2.5 checkpoints use rope types" in _problems(_spec(tmp_path), cfg)["rope_type"].rule


def test_head_dim_without_a_trtllm_kernel(tmp_path):
    cfg = dict(hf_config("qwen2.5-7b"), head_dim=72, num_key_value_heads=28)  # MHA (no XQA), 72 not in MMHA's list
    p = _problems(_spec(tmp_path, runtime="trtllm"), cfg)["head_dim"]
    assert p.value == 72 and "trtllm-llmapi" in p.fix


def test_unsupported_family_is_refused_by_plan_as_by_build(tmp_path):
    """`trtpipe plan` runs the build's family checks: a GPT-NeoX config is refused, not planned."""
    cfg = dict(hf_config("qwen2.5-7b"), architectures=["GPTNeoXForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "plan", str(REPO / "configs/builds/qwen2.5-7b.yaml"),
                        "--target", "h100", "--hf-config", str(tmp_path / "config.json"),
                        "--output", str(tmp_path / "plan.json")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and "GPTNeoXForCausalLM is not supported" in r.stderr + r.stdout
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.2-1b", "mistral-7b", "qwen2.5-7b", "qwen3-8b",
                                  "gemma-2-9b", "gemma-3-1b", "phi-3-mini", "phi-4", "mixtral-8x7b",
                                  "qwen3-30b-a3b", "qwen1.5-moe-a2.7b"])
def test_stored_configs_read_as_their_family(name):
    from builders.model_shape import ModelShape
    from plugins.architectures import architecture

    cfg = hf_config(name)
    shape = ModelShape.from_hf_config(cfg)
    arch = architecture(shape.architecture)
    assert arch is not None and all(t in arch.rope_types for t in shape.rope_types)
    assert shape.is_moe == (arch.moe is not None)
    if name.startswith("gemma"):
        assert shape.head_dim == 256 and shape.sliding_window and shape.tie_word_embeddings
    if name == "mixtral-8x7b":
        assert (shape.num_experts, shape.num_experts_per_tok, shape.moe_intermediate_size) == (8, 2, 14336)
    if name == "qwen1.5-moe-a2.7b":
        assert shape.shared_expert_intermediate_size == 5632 and shape.num_experts == 60


def test_plan_reports_the_spec_and_the_family_problems_at_once(tmp_path):
    """A spec rule (Triton's batch above the engine's) and a family rule (MoE INT4) in one error."""
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"name: bad\nmodel: {{source: {tmp_path / 'absent'}, hf_config: {REPO}/tests/assets/mixtral-8x7b/"
                    "config.json}\nruntime: trtllm-llmapi\ndtype: bfloat16\nquantization: {quant_algo: int4_awq}\n"
                    "limits: {max_batch_size: 8}\nserving: {triton_max_batch_size: 16}\ntargets: {h100: {}}\n")
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "plan", str(spec), "--target", "h100",
                        "--output", str(tmp_path / "plan.json")], capture_output=True, text=True, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "2 problems" in out, out
    assert "serving.triton_max_batch_size = 16" in out and "quantization.quant_algo = 'int4_awq'" in out


def test_trtllm_build_rules_do_not_apply_to_the_llm_api(tmp_path):
    """FP8 KV cache + KV reuse with INT4 weights is refused for trtllm-build (no FP8 context FMHA, so no paged
    context FMHA); the LLM API builds no engine and takes it."""
    cfg = hf_config("qwen3-8b")
    extra = ", kv_cache_quant_algo: fp8"
    p = tmp_path / "b.yaml"
    for runtime in ("trtllm", "trtllm-llmapi"):
        p.write_text(f"name: b\nmodel: {{source: {tmp_path / 'absent'}}}\nruntime: {runtime}\ndtype: bfloat16\n"
                     f"quantization: {{quant_algo: int4_awq{extra}}}\nserving: {{enable_kv_cache_reuse: true}}\n"
                     "targets: {h100: {}}\n")
        build = load_spec(p, "h100")
        if runtime == "trtllm":
            assert "fp8_kv_paged_context" in _problems(build, cfg)
        else:
            make_plan(build, get_target("h100"), cfg)


def test_plan_states_the_tensorrt_llm_versions_of_its_path(tmp_path):
    cfg = hf_config("qwen3-8b")
    engine = make_plan(_spec(tmp_path, runtime="trtllm"), get_target("h100"), cfg)
    hf = make_plan(_spec(tmp_path, runtime="trtllm-llmapi"), get_target("h100"), cfg)
    assert engine.tensorrt_llm_versions.startswith("1.2.x only") and hf.tensorrt_llm_versions.startswith("1.2.1 and")
    assert any("1.2.x only; runtime trtllm-llmapi" in w for w in engine.warnings)
    assert not any("1.2.x only" in w for w in hf.warnings)


def test_nvfp4_needs_blackwell_and_the_unified_checkpoint(tmp_path):
    cfg = hf_config("qwen3-8b")
    assert "nvfp4_sm" in _problems(_spec(tmp_path, quant="nvfp4"), cfg)  # h100 is SM 90
    plan = make_plan(_spec(tmp_path, quant="nvfp4", target="b200"), get_target("b200"), cfg)
    assert plan.checkpoint_format == "hf_unified"
    p = _problems(_spec(tmp_path, runtime="trtllm", quant="nvfp4", target="b200"), cfg, "b200")["family_quant"]
    assert "nvfp4 is exported only as hf_unified" in p.rule and "nvfp4" not in p.fix.split(": ")[1].split(" | ")
