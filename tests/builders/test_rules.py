"""Every invalid spec under tests/specs/invalid/ is rejected, fast, naming its field and rule.

Each file starts with ``# expect: <field> <code>`` and ``# model: <asset>`` (a folder of
tests/assets/ holding the model's config.json); its single ``targets`` key is the target. A ``# fix: <text>`` line
says what that problem's fix must contain (a did-you-mean, a suggested value), ``# not in fix: <text>`` what it must
not (a choice the rules refuse on that target).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from builders import perf_model, preflight
from plugins.errors import SpecError
from builders.plan import compute_plan
from builders.preflight import make_plan
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import hf_config

INVALID = sorted((Path(__file__).resolve().parents[1] / "specs" / "invalid").glob("*.yaml"))


def _header(path: Path) -> tuple[str, str, str]:
    lines = path.read_text().splitlines()
    field, code = lines[0].split()[2:4]
    model = lines[1].split(":", 1)[1].strip()
    return field, code, model


def _problems(path: Path) -> list:
    """Run spec loading + pre-flight + planner rules the way `trtpipe plan` does; return the problems."""
    field, code, model = _header(path)
    target_name = next(iter(yaml.safe_load(path.read_text()).get("targets") or {"cpu": {}}))
    try:
        build = load_spec(path, target_name)
        make_plan(build, get_target(target_name), hf_config(model))
    except SpecError as exc:
        return exc.problems
    return []


def test_there_are_at_least_40_invalid_specs():
    assert len(INVALID) >= 40


def _no_process(*args, **kwargs):
    raise AssertionError(f"a rule started a process ({args[:1]}): the rules only read the spec and config.json")


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_spec_is_rejected_with_field_and_code(path, monkeypatch):
    """Rejected from the spec and config.json alone (fast because nothing runs: no process, no perf model),
    naming the field and the rule."""
    field, code, _ = _header(path)
    monkeypatch.setattr(subprocess, "Popen", _no_process)
    monkeypatch.setattr(perf_model, "run_worker", _no_process)
    t0 = time.perf_counter()
    problems = _problems(path)
    elapsed = time.perf_counter() - t0
    print(f"{path.stem}: rejected in {elapsed * 1000:.1f} ms")  # information only: no speed is asserted
    found = [(p.field, p.code) for p in problems]
    assert (field, code) in found, f"expected ({field}, {code}), got {found}"
    for line in path.read_text().splitlines():  # "# fix: <text>": the fix of that problem says it
        if line.startswith("# fix: "):
            fixes = [p.fix for p in problems if (p.field, p.code) == (field, code)]
            assert any(line[len("# fix: "):] in f for f in fixes), fixes
        if line.startswith("# not in fix: "):  # ... and what it must not suggest (refused on this target)
            fixes = [p.fix for p in problems if (p.field, p.code) == (field, code)]
            assert not any(line[len("# not in fix: "):] in f for f in fixes), fixes
    for p in problems:  # every message names the value, the rule and the fix
        assert p.rule and p.fix and p.field
        assert p.field in str(SpecError([p]))


def test_all_problems_are_reported_at_once(llama3_8b, tmp_path):
    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nruntime: trtllm\nquantization: {quant_algo: fp8, kv_cache_quant_algo: fp8}\n"
                    "parallelism: {tp_size: 16}\nlimits: {max_input_len: 4096, max_seq_len: 4096, "
                    "max_num_tokens: 2048}\nserving: {triton_max_batch_size: 64, decoupled: false}\n"
                    "targets: {a100-80gb: {}}\n")
    with pytest.raises(SpecError) as err:
        make_plan(load_spec(spec, "a100-80gb"), get_target("a100-80gb"), llama3_8b)
    assert {"world_size", "seq_len_vs_input", "num_tokens_vs_input", "triton_batch_vs_engine",
            "streaming_decoupled", "fp8_sm", "fp8_kv_sm"} <= set(err.value.codes())


def test_paged_context_fmha_consistency_rule_fires_when_resolver_disagrees(monkeypatch, tmp_path):
    """The resolver always enables paged context FMHA today; prove the rule catches a regression."""
    import plugins.resolve as resolve

    real = resolve.resolve_plugins

    def broken(**kw):
        return [d if d.flag != "use_paged_context_fmha" else resolve.PluginDecision(d.flag, "disable", "bug")
                for d in real(**kw)]

    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nruntime: trtllm\nquantization: {quant_algo: fp8}\n"
                    "serving: {enable_kv_cache_reuse: true}\ntargets: {h100: {}}\n")
    build = load_spec(spec, "h100")
    assert "paged_context_fmha" not in [p.code for p in preflight.spec_problems(build, get_target("h100"))]
    import builders.plan

    monkeypatch.setattr(builders.plan, "resolve_plugins", broken)  # where plugin_decisions looks it up
    problems = preflight.spec_problems(build, get_target("h100"))
    assert [(p.field, p.code) for p in problems] == [("serving.enable_kv_cache_reuse", "paged_context_fmha")]


def test_kv_head_duplication_is_a_warning_not_an_error(llama3_8b, tmp_path):
    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nruntime: trtllm\nquantization: {quant_algo: fp8}\nparallelism: {tp_size: 16, "
                    "num_nodes: 2}\nlimits: {max_input_len: 1024, max_seq_len: 2048}\ntargets: {h100: {}}\n")
    plan = make_plan(load_spec(spec, "h100"), get_target("h100"), llama3_8b)
    assert any("duplicated KV head" in w for w in plan.warnings)
    assert plan.memory.kv.kv_heads_per_rank == 1
    assert any("crosses nodes" in w for w in plan.warnings)


def test_fp8_on_portable_runtime_is_allowed_on_ampere(llama3_8b, tmp_path):
    """The portable runtime dequantizes, so FP8 hardware gates do not apply to it."""
    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nruntime: pytorch\nquantization: {quant_algo: fp8}\ntargets: {a100-80gb: {}}\n")
    build = load_spec(spec, "a100-80gb")
    assert preflight.spec_problems(build, get_target("a100-80gb")) == []
    assert compute_plan(build, get_target("a100-80gb"), llama3_8b).memory.kv.dtype_bytes == 2


def test_check_model_reads_config_json(tmp_path, smollm2):
    import json

    (tmp_path / "config.json").write_text(json.dumps(smollm2))
    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nquantization: {group_size: 128}\ntargets: {cpu: {}}\n")
    with pytest.raises(SpecError) as err:
        preflight.check_model(load_spec(spec, "cpu"), get_target("cpu"), tmp_path)
    assert err.value.codes() == ["awq_group"]


# ---- every fix a rule suggests passes the rules (builders.fix_choices) ----

GATES = {"fp8_sm", "nvfp4_sm", "int4_sm100", "fp8_kv_sm", "family_quant", "family_runtime", "runtime_target",
         "llmapi_feature", "guided_backend_runtime", "kv_host_cache_runtime", "head_dim"}
"""The rules that refuse a quantization or a runtime for a target and model: a suggested one must pass them."""
_FEATURES = [{}, {"serving": {"guided_decoding_backend": "llguidance"}},
             {"serving": {"speculative_decoding": {"mode": "ngram"}}},
             {"serving": {"kv_cache_host_memory_bytes": 2**30}}]


def _gate_problems(settings: dict, target: str, cfg: dict) -> set[tuple[str, str]]:
    from builders.spec import BuildSettings, ModelSource, ResolvedBuild

    build = ResolvedBuild(name="t", target=target, spec_path="<test>", model=ModelSource(),
                          settings=BuildSettings.model_validate(settings))
    try:
        make_plan(build, get_target(target), cfg)
    except SpecError as exc:
        return {(p.code, p.field) for p in exc.problems if p.code in GATES}, exc.problems
    return set(), []


def _named(text: str, names) -> list[str]:
    import re

    text = text.split("kv_cache_quant_algo")[0]  # a KV-cache suggestion is not a quant_algo one
    return [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]


def _suggestions(problem) -> list[tuple[str, str]]:
    from plugins.recipes import QUANT_RECIPES
    from plugins.runtimes import RUNTIMES

    quants = [("quantization.quant_algo", q) for q in _named(problem.fix, QUANT_RECIPES) if q != "none"]
    runtimes = [("runtime", r) for r in _named(problem.fix, RUNTIMES)]
    return quants + runtimes


def test_every_suggested_quantization_or_runtime_passes_the_rules():
    """Over models x targets x runtimes x recipes (and the runtime-only serving features): each quant_algo or
    runtime a problem's fix names, applied, is not refused by a gate rule that the build did not break already, and
    the problem that suggested it is gone (e.g. nvfp4 on an A100 must not suggest fp8, which the A100 lacks; a CPU
    target must not be told to use trtllm-llmapi)."""
    from itertools import product

    from plugins.recipes import QUANT_RECIPES
    from plugins.runtimes import RUNTIMES

    bad, checked = [], 0
    for asset, target, runtime, quant, extra in product(
            ("llama-3-8b", "gemma-2-9b", "mixtral-8x7b"), ("cpu", "a10", "a100-80gb", "l40s", "b200"),
            RUNTIMES, QUANT_RECIPES, _FEATURES):
        if extra and quant != "int4_awq":
            continue
        cfg = hf_config(asset)
        settings = {"runtime": runtime, "quantization": {"quant_algo": quant}, **extra}
        before, problems = _gate_problems(settings, target, cfg)
        for p in problems:
            if p.code not in GATES:
                continue
            for field, value in _suggestions(p):
                fixed = {**settings, "runtime": value} if field == "runtime" else \
                    {**settings, "quantization": {"quant_algo": value}}
                after, _ = _gate_problems(fixed, target, cfg)
                checked += 1
                if (p.code, p.field) in after or not after <= before:
                    bad.append(f"{asset} on {target} ({runtime}, {quant}, {extra}): {p.code} suggests {field}={value}, "
                               f"refused by {sorted(after - before) or [(p.code, p.field)]}: {p.fix}")
    assert checked > 50  # the sweep reaches suggestions at all
    assert not bad, "\n".join(bad[:20]) + f"\n({len(bad)} in all)"


def test_a_kv_fix_never_raises_a_fraction_at_its_bound_nor_names_fp8_kv_where_the_gpu_lacks_it(llama3_8b):
    """kv_pool_one_seq: with kv_cache_free_gpu_mem_fraction at its maximum (1.0) the fix does not ask for more of it
    (it frees memory around the pool instead); an A10 (SM 86) is not told to use an FP8 KV cache, an L4 (SM 89, the
    same 24 GB) is."""
    from builders.spec import BuildSettings, ModelSource, ResolvedBuild

    def problem(target: str, fraction: float):
        settings = {"runtime": "trtllm", "dtype": "bfloat16", "quantization": {"quant_algo": "none"},
                    "limits": {"max_batch_size": 1, "max_input_len": 8000, "max_seq_len": 8192,
                               "max_num_tokens": 8192},
                    "serving": {"kv_cache_free_gpu_mem_fraction": fraction}}
        build = ResolvedBuild(name="t", target=target, spec_path="<test>", model=ModelSource(),
                              settings=BuildSettings.model_validate(settings))
        with pytest.raises(SpecError) as err:  # a 44-layer Llama-3-8B: 21 GB of weights, room for < 8192 tokens
            make_plan(build, get_target(target), {**llama3_8b, "num_hidden_layers": 44})
        (p,) = [p for p in err.value.problems if p.code == "kv_pool_one_seq"]
        return p.fix

    at_bound = problem("a10", 1.0)
    assert "allow >=" not in at_bound and "FP8" not in at_bound, at_bound
    assert "free memory for it (lower limits.max_num_tokens, raise parallelism.tp_size/pp_size)" in at_bound
    assert "allow >= 8192 tokens" in problem("a10", 0.5)
    assert "use an FP8 KV cache" in problem("l4", 1.0)
