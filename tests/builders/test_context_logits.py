"""limits.gather_context_logits: the spec field, its rules, its memory in the plan and the trtllm-build flags.

The buffer's size is checked against a hand computation of TensorRT-LLM's rule (builders.plan.context_logits_bytes:
max_num_tokens x vocab padded to tp x pp x 4 B); the flags against the trtllm-build double, whose parser is the
recorded facts' (tests/facts/trtllm_1_2_1/trtllm_build.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.engine_trtllm import check_engine_output, run_trtllm_build, trtllm_build_argv
from builders.plan import compute_plan
from builders.preflight import make_plan
from builders.spec import BuildSettings, LimitsConfig, ModelSource, ResolvedBuild, json_schema
from plugins.errors import SpecError, StageError
from plugins.targets import get_target
from tests.builders.test_engine_trtllm import _ckpt, _plugins
from tests.conftest import DOUBLE

LIMITS = {"max_batch_size": 16, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 4096}


def _build(target="h100", gather=True, runtime="trtllm", tp=1, pp=1, **serving) -> ResolvedBuild:
    settings = {"runtime": runtime, "quantization": {"quant_algo": "none"},
                "parallelism": {"tp_size": tp, "pp_size": pp},
                "limits": {**LIMITS, "gather_context_logits": gather}, "serving": serving}
    return ResolvedBuild(name="t", target=target, spec_path="<test>", model=ModelSource(),
                         settings=BuildSettings.model_validate(settings))


def _codes(build, target, cfg) -> list:
    try:
        make_plan(build, get_target(target), cfg)
    except SpecError as exc:
        return exc.problems
    return []


# --- the spec field ---------------------------------------------------------------------------------------------

def test_the_field_is_off_by_default_and_leaves_the_engine_key_as_it_was():
    """Off, it is left out of every dump: the engine key (and engine.json's build_config) of a build without it is
    what it was before the field existed; on, it enters the key, so the engine is rebuilt with the flag."""
    off, on = _build(gather=False), _build(gather=True)
    assert LimitsConfig().gather_context_logits is False
    assert "gather_context_logits" not in off.key_fields("engine")["limits"]
    assert off.key_fields("engine")["limits"] == LimitsConfig(**LIMITS).engine_limits() | {"tokens_per_block": 32}
    assert on.key_fields("engine")["limits"]["gather_context_logits"] is True
    assert on.key_fields("engine") != off.key_fields("engine")
    prop = json_schema()["$defs"]["LimitsConfig"]["properties"]["gather_context_logits"]
    assert prop["type"] == "boolean" and prop["default"] is False and "gather_context_logits" in prop["description"]


@pytest.mark.parametrize("runtime,target", [("pytorch", "cpu"), ("pytorch", "h100"), ("trtllm-llmapi", "h100")])
def test_refused_where_no_trt_engine_is_built(smollm2, runtime, target):
    problems = [p for p in _codes(_build(target, runtime=runtime), target, smollm2) if p.code == "context_logits_runtime"]
    assert len(problems) == 1
    p = problems[0]
    assert p.field == "limits.gather_context_logits" and p.value is True
    assert f"runtime {runtime} builds no TensorRT engine" in p.rule and "return_prompt_log_probs" in p.rule
    assert "targets.<target>.limits.gather_context_logits" in p.fix


def test_refused_with_speculative_decoding(smollm2):
    build = _build(speculative_decoding={"mode": "ngram"})
    codes = {p.code: p for p in _codes(build, "h100", smollm2)}
    assert "context_logits_speculative" in codes and "max_draft_len > 0" in codes["context_logits_speculative"].rule


def test_accepted_on_trtllm(smollm2):
    assert _codes(_build(), "h100", smollm2) == []


# --- the plan ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp,pp,vocab_padded", [(1, 1, 49152), (9, 1, 49158), (3, 2, 49152), (9, 2, 49158)])
def test_the_buffer_is_max_num_tokens_times_the_padded_vocab_in_float32(smollm2, tp, pp, vocab_padded):
    """SmolLM2's 49152 ids padded to a multiple of tp x pp (49152 = 2^14 x 3: 9 and 18 ranks pad it to 49158)."""
    assert smollm2["vocab_size"] == 49152
    plan = compute_plan(_build(tp=tp, pp=pp), get_target("h100"), smollm2)
    assert plan.memory.context_logits_bytes == 4096 * vocab_padded * 4
    assert plan.to_json()["memory"]["context_logits_bytes"] == 4096 * vocab_padded * 4  # plan.json shows it
    assert plan.to_json()["limits"]["gather_context_logits"] is True


def test_the_buffer_sits_beside_the_kv_pool_which_keeps_its_size(llama3_8b):
    """TensorRT-LLM sizes the KV pool before the buffer exists (it is allocated at the first context step), so the
    pool is the same with or without it; the buffer adds to the total, out of what the pool leaves."""
    off = compute_plan(_build(gather=False), get_target("h100"), llama3_8b)
    on = compute_plan(_build(gather=True), get_target("h100"), llama3_8b)
    ctx = 4096 * 128256 * 4
    assert off.memory.context_logits_bytes == 0 and on.memory.context_logits_bytes == ctx
    assert on.memory.kv.pool_bytes == off.memory.kv.pool_bytes
    assert on.memory.total_bytes - off.memory.total_bytes == ctx
    assert on.memory.activation_bytes == off.memory.activation_bytes


def test_a_buffer_the_pool_leaves_no_room_for_is_refused_with_a_fraction_that_fits(llama3_8b):
    build = _build(kv_cache_free_gpu_mem_fraction=0.99)
    problems = {p.code: p for p in _codes(build, "h100", llama3_8b)}
    p = problems["context_logits_fit"]
    assert p.field == "serving.kv_cache_free_gpu_mem_fraction" and p.value == 0.99
    fits = float(p.fix.split("<= ")[1].split(",")[0])
    plan = compute_plan(build, get_target("h100"), llama3_8b)
    free = plan.memory.free_bytes_after_weights_and_activations
    assert free * (1 - 0.99) < plan.memory.context_logits_bytes <= free * (1 - fits)
    assert "context_logits_fit" not in {p.code for p in _codes(_build(kv_cache_free_gpu_mem_fraction=fits), "h100",
                                                              llama3_8b)}
    assert "context_logits_fit" not in {p.code for p in _codes(_build(gather=False, kv_cache_free_gpu_mem_fraction=0.99),
                                                              "h100", llama3_8b)}


# --- the engine stage -------------------------------------------------------------------------------------------

def test_trtllm_build_gets_the_flag_and_float32_logits_only_when_set(tmp_path):
    def argv(gather):
        return trtllm_build_argv(checkpoint_dir=_ckpt(tmp_path / str(gather), 1), output_dir=tmp_path / f"e{gather}",
                                 limits=LimitsConfig(**LIMITS, gather_context_logits=gather), plugins=_plugins(),
                                 world_size=1, gpus_available=1, executable=[str(DOUBLE)])

    (tmp_path / "True").mkdir()
    (tmp_path / "False").mkdir()
    on, off = argv(True), argv(False)
    assert "--gather_context_logits" not in off and "--logits_dtype" not in off
    assert "--gather_context_logits" in on and on[on.index("--logits_dtype") + 1] == "float32"
    run_trtllm_build(on, tmp_path / "log", progress=False)  # the double's parser is the facts'
    cfg = check_engine_output(tmp_path / "eTrue", world_size=1, limits=LimitsConfig(**LIMITS, gather_context_logits=True))
    assert cfg["build_config"]["gather_context_logits"] is True and cfg["pretrained_config"]["logits_dtype"] == "float32"


def test_an_engine_built_without_the_flag_is_refused(tmp_path):
    out = tmp_path / "engine"
    argv = trtllm_build_argv(checkpoint_dir=_ckpt(tmp_path, 1), output_dir=out, limits=LimitsConfig(**LIMITS),
                             plugins=_plugins(), world_size=1, gpus_available=1, executable=[str(DOUBLE)])
    run_trtllm_build(argv, tmp_path / "log", progress=False)
    with pytest.raises(StageError, match="gather_context_logits: engine False vs plan True"):
        check_engine_output(out, world_size=1, limits=LimitsConfig(**LIMITS, gather_context_logits=True))
    assert json.loads((out / "config.json").read_text())["build_config"]["gather_context_logits"] is False
    check_engine_output(out, world_size=1, limits=LimitsConfig(**LIMITS))


def test_the_flags_exist_in_the_recorded_facts():
    facts = json.loads((Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "trtllm_build.json").read_text())
    assert facts["flags"]["--gather_context_logits"]["type"] == "store_true"
    assert "float32" in facts["flags"]["--logits_dtype"]["choices"]
    assert facts["build_config_defaults"]["gather_context_logits"] is False
