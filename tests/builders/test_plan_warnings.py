"""The plan's warnings (builders.plan_warnings): their texts and order, pinned on the shipped builds and on
builds made to raise each one, as compute_plan wrote them when the warnings were inline in it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from builders.plan import compute_plan
from builders.plan_warnings import PLAN_WARNINGS, PlanFacts, plan_warnings
from builders.spec import BuildSettings, ModelSource, ResolvedBuild, load_spec
from plugins.targets import get_target
from tests.conftest import ASSETS, REPO, hf_config

PINNED = Path(__file__).with_name("plan_warnings_pinned.json")
"""{case: [warning text, ...]}: written by :func:`warnings_by_case` before the warnings left compute_plan."""

_LIM = {"max_batch_size": 16, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 4096}
_EAGLE = {"mode": "eagle3", "max_draft_len": 3, "draft_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
          "draft_hf_config": str(ASSETS / "eagle3-llama3.1-8b" / "config.json")}
MADE = {  # case: (config asset, target, settings, model fields)
    "kv-heads-vocab-tp9-h100": ("smollm2-135m", "h100", {"runtime": "trtllm", "parallelism": {"tp_size": 9}}, {}),
    "pytorch-tp2-kvfp8-int4-h100": ("llama-3-8b", "h100", {
        "runtime": "pytorch", "quantization": {"quant_algo": "int4_awq", "kv_cache_quant_algo": "fp8"},
        "parallelism": {"tp_size": 2}}, {}),
    "llmapi-tp2-pytorch-h100": ("llama-3-8b", "h100", {"runtime": "trtllm-llmapi", "parallelism": {"tp_size": 2}},
                                {}),
    "pytorch-tp2-nvfp4-b200": ("llama-3-8b", "b200", {"runtime": "pytorch", "quantization": {"quant_algo": "nvfp4"},
                                                      "parallelism": {"tp_size": 2}}, {}),
    "gemma2-pytorch-cpu": ("gemma-2-9b", "cpu", {"runtime": "pytorch"}, {}),
    "tp16-h100": ("llama-3-8b", "h100", {"runtime": "trtllm", "parallelism": {"tp_size": 16}}, {}),
    "clamped-tokens-h100": ("smollm2-135m", "h100", {"runtime": "trtllm", "limits": {
        "max_batch_size": 1, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 4096}}, {}),
    "kv-bound-a10": ("llama-3-8b", "a10", {"runtime": "trtllm", "dtype": "bfloat16", "limits": {
        "max_batch_size": 256, "max_input_len": 4096, "max_seq_len": 8192, "max_num_tokens": 8192}}, {}),
    "kv-bound-capped-fp8kv-h100": ("llama-3-8b", "h100", {
        "runtime": "trtllm", "quantization": {"quant_algo": "fp8", "kv_cache_quant_algo": "fp8"},
        "serving": {"max_tokens_in_paged_kv_cache": 20000}, "limits": {
            "max_batch_size": 64, "max_input_len": 4096, "max_seq_len": 8192, "max_num_tokens": 8192}}, {}),
    "kv-bound-pytorch-cpu": ("llama-3-8b", "cpu", {"runtime": "pytorch", "serving": {
        "max_tokens_in_paged_kv_cache": 9000}, "limits": _LIM}, {}),
    "headroom-a10": ("llama-3-8b", "a10", {"runtime": "trtllm", "limits": _LIM}, {}),
    "headroom-pytorch-l4": ("llama-3-8b", "l4", {"runtime": "pytorch", "limits": _LIM}, {}),
    "fp8-available-l40s": ("llama-3-8b", "l40s", {"runtime": "trtllm-llmapi", "quantization": {"quant_algo": "none"},
                                                  "limits": _LIM}, {}),
    "fp8-available-b200": ("llama-3-8b", "b200", {"runtime": "trtllm", "quantization": {"quant_algo": "none"}}, {}),
    "no-fp8-a100": ("llama-3-8b", "a100-80gb", {"runtime": "trtllm", "quantization": {"quant_algo": "none"}}, {}),
    "eagle3-tokens-h100": ("llama-3.1-8b", "h100", {"runtime": "trtllm-llmapi", "limits": {
        "max_batch_size": 64, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 128},
        "serving": {"speculative_decoding": _EAGLE}}, {}),
    "eagle3-no-draft-config-h100": ("llama-3.1-8b", "h100", {"runtime": "trtllm-llmapi", "serving": {
        "speculative_decoding": {**_EAGLE, "draft_hf_config": None, "draft_model": "/nonexistent/draft",
                                 "max_concurrency": 8}}}, {}),
    "ngram-h200": ("llama-3-8b", "h200", {"runtime": "trtllm-llmapi", "serving": {
        "speculative_decoding": {"mode": "ngram", "max_draft_len": 4}}}, {}),
    "trust-remote-code-no-code-cpu": ("smollm2-135m", "cpu", {"runtime": "pytorch"}, {"trust_remote_code": True}),
    "trust-remote-code-phi3-cpu": ("phi-3-mini", "cpu", {"runtime": "pytorch"}, {"trust_remote_code": True}),
    "remote-code-not-run-phi3-h100": ("phi-3-mini", "h100", {"runtime": "trtllm"}, {}),
    "compressed-tensors-llmapi-h100": ("llama-3.1-8b-fp8-dynamic", "h100", {"runtime": "trtllm-llmapi"}, {}),
    "lora-slots-llama3-h100": ("llama-3-8b", "h100", {"runtime": "trtllm", "lora": {
        "adapters": {f"a{i}": f"/adapters/a{i}" for i in range(6)}, "max_loras": 4, "max_cpu_loras": 5}}, {}),
}


def _shipped() -> dict[str, tuple[ResolvedBuild, dict]]:
    out = {}
    for path in sorted((REPO / "configs" / "builds").glob("*.yaml")):
        for target in yaml.safe_load(path.read_text()).get("targets") or {"cpu": {}}:
            build = load_spec(path, target)
            cfg = (json.loads(Path(build.model.hf_config).read_text()) if build.model.hf_config
                   else hf_config("smollm2-135m"))
            out[f"{path.stem}-{target}"] = build, cfg
    return out


def _made() -> dict[str, tuple[ResolvedBuild, dict]]:
    return {case: (ResolvedBuild(name="t", target=target, spec_path="<test>", model=ModelSource(**model),
                                 settings=BuildSettings.model_validate(settings)), hf_config(asset))
            for case, (asset, target, settings, model) in MADE.items()}


def _cases() -> dict[str, tuple[ResolvedBuild, dict]]:
    return {**_shipped(), **_made()}


def _adapters(build: ResolvedBuild, cfg: dict) -> list:
    """Rank-16 q/v adapters of every layer for the names of ``lora.adapters`` (as builders.lora reads them; their
    folders need not exist: the warnings read the plan only)."""
    from builders.lora import Adapter, expected_shape
    from builders.model_shape import ModelShape

    shape = ModelShape.from_hf_config(cfg)
    layers = range(shape.num_hidden_layers)
    return [Adapter(name=name, path=Path(path), task_id=i, rank=16, alpha=32.0, use_rslora=False,
                    target_modules=("q_proj", "v_proj"), layers=tuple(layers),
                    shapes={(layer, m): expected_shape(shape, m) for layer in layers for m in ("q_proj", "v_proj")})
            for i, (name, path) in enumerate(build.settings.lora.adapters.items(), start=1)]


def _plan(build: ResolvedBuild, cfg: dict):
    from builders.plan import draft_config

    return compute_plan(build, get_target(build.target), cfg, isl=1024, osl=256, adapters=_adapters(build, cfg),
                        **dict(zip(("draft", "draft_source"), draft_config(build))))


def warnings_by_case() -> dict[str, list[str]]:
    """Every case's ``Plan.warnings`` (the pinned file is this, written once)."""
    return {case: _plan(build, cfg).warnings for case, (build, cfg) in _cases().items()}


def test_plan_warnings_are_the_texts_compute_plan_wrote_inline():
    assert warnings_by_case() == json.loads(PINNED.read_text())


def test_every_warning_has_a_case_and_a_unique_code():
    codes = [w.code for w in PLAN_WARNINGS]
    assert len(codes) == len(set(codes))
    seen = set()
    for build, cfg in _cases().values():
        plan = _plan(build, cfg)
        found = plan_warnings(PlanFacts(plan, build, get_target(build.target), cfg))
        assert [text for _, text in found] == plan.warnings
        seen |= {code for code, _ in found}
    assert seen == set(codes), set(codes) - seen


def _transformers_sliding_layers(cfg: dict) -> int:
    """How many layers transformers' own config class makes sliding-window layers (its layer_types, filled in
    from its defaults when config.json has none: what the portable runtime's continuous batching groups by)."""
    from transformers import AutoConfig

    kw = {k: v for k, v in cfg.items() if not k.startswith("_")}
    model_type = kw.pop("model_type")
    conf = AutoConfig.for_model(model_type, **kw)
    return list(conf.layer_types).count("sliding_attention")


def test_sliding_layers_are_those_transformers_makes_sliding():
    """Gemma 2's config.json (no layer_types) alternates sliding and global layers: 21 of 42 slide, not all 42."""
    from builders.model_shape import ModelShape

    for asset in ("gemma-2-9b", "gemma-3-1b"):
        cfg = hf_config(asset)
        shape = ModelShape.from_hf_config(cfg)
        assert shape.sliding_layers == _transformers_sliding_layers(cfg), asset
    assert ModelShape.from_hf_config(hf_config("gemma-2-9b")).sliding_layers == 21


def test_the_portable_runtime_says_what_it_does_with_the_window():
    """Gemma 2 on the portable runtime: the plan says the window is honoured (transformers' continuous batching keeps
    sliding layers' KV in a ring buffer of the window) and that its KV figures are an upper bound past the window;
    a model without a window gets no such warning."""
    build, cfg = _made()["gemma2-pytorch-cpu"]
    long = build.model_copy(update={"settings": build.settings.model_copy(update={
        "limits": build.settings.limits.model_copy(update={"max_input_len": 6000, "max_seq_len": 8192})})})
    found = dict(plan_warnings(PlanFacts(_plan(long, cfg), long, get_target("cpu"), cfg)))
    text = found["portable_sliding_window"]
    assert text.startswith("21 of 42 layers use a 4096-token sliding window, and the portable runtime honours it")
    assert "upper bound" in text
    short = dict(plan_warnings(PlanFacts(_plan(build, cfg), build, get_target("cpu"), cfg)))
    assert "upper bound" not in short["portable_sliding_window"]
    smol, smol_cfg = _made()["trust-remote-code-no-code-cpu"]
    assert "portable_sliding_window" not in dict(plan_warnings(PlanFacts(_plan(smol, smol_cfg), smol,
                                                                         get_target("cpu"), smol_cfg)))


def test_headroom_and_kv_fixes_name_only_what_the_target_runs():
    """On an A10 (SM 86: no FP8) an engine build nearly out of memory is told to quantize with recipes the A10 runs
    (int4_awq, int8_sq...), never fp8; a KV-bound one is not told to use an FP8 KV cache, and with the KV fraction
    at its maximum (1.0) not to raise it."""
    settings = {"runtime": "trtllm", "dtype": "bfloat16", "quantization": {"quant_algo": "none"},
                "limits": {"max_batch_size": 256, "max_input_len": 4096, "max_seq_len": 8192,
                           "max_num_tokens": 8192}, "serving": {"kv_cache_free_gpu_mem_fraction": 1.0}}
    build = ResolvedBuild(name="t", target="a10", spec_path="<test>", model=ModelSource(),
                          settings=BuildSettings.model_validate(settings))
    cfg = {**hf_config("llama-3-8b"), "num_hidden_layers": 42}
    found = dict(plan_warnings(PlanFacts(_plan(build, cfg), build, get_target("a10"), cfg)))
    headroom = found["memory_headroom"]
    assert "quantize (quant_algo int4_awq | int4_rtn | int4_gptq | int8_sq)" in headroom and "fp8" not in headroom, headroom
    kv = found["kv_bound_max_seq_len"]
    assert "FP8" not in kv and "raise serving.kv_cache_free_gpu_mem_fraction" not in kv, kv
    assert kv.endswith("fix: use more tp/pp ranks, or lower limits.max_batch_size to "
                       f"{_plan(build, cfg).memory.kv.max_seq_len_sequences} or limits.max_seq_len")
