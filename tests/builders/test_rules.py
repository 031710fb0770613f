"""Every invalid spec under tests/specs/invalid/ is rejected, fast, naming its field and rule.

Each file starts with ``# expect: <field> <code>`` and ``# model: <asset>`` (a folder of
tests/assets/ holding the model's config.json); its single ``targets`` key is the target.
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
