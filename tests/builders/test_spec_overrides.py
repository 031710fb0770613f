"""Every target's overrides are validated when the file is parsed, whichever target is resolved; unknown keys
that are other tools' names for ours get that key as their did-you-mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.spec import load_spec
from plugins.errors import SpecError


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "b.yaml"
    p.write_text(text)
    return p


def _problems(path: Path, target: str) -> list:
    with pytest.raises(SpecError) as err:
        load_spec(path, target)
    return err.value.problems


def test_typo_in_another_targets_override_is_reported(tmp_path):
    spec = _write(tmp_path, "name: b\ntargets: {cpu: {}, h100: {runtime: trtllm, limits: {max_batch_szie: 8}}}\n")
    for target in ("cpu", "h100"):  # whichever target is resolved
        problems = _problems(spec, target)
        assert [(p.field, p.code) for p in problems] == [("targets.h100.limits.max_batch_szie", "unknown_key")]
        assert "Did you mean 'max_batch_size'?" in problems[0].fix


@pytest.mark.parametrize("override,field,code", [
    ("{limits: {max_batch_size: eight}}", "targets.h100.limits.max_batch_size", "int_parsing"),
    ("{limits: {max_batch_size: 0}}", "targets.h100.limits.max_batch_size", "greater_than_equal"),
    ("{limits: {tokens_per_block: 48}}", "targets.h100.limits.tokens_per_block", "value_error"),
    ("{quantization: {quant_algo: int3}}", "targets.h100.quantization.quant_algo", "literal_error"),
    ("{serving: {streaming: maybe}}", "targets.h100.serving.streaming", "bool_parsing"),
    ("{serving: {instance_counts: {preprocesing: 2}}}", "targets.h100.serving.instance_counts.preprocesing",
     "unknown_key"),
    ("{model: {source: x}}", "targets.h100.model", "unknown_key"),
])
def test_bad_value_in_a_target_not_planned_names_that_target(tmp_path, override, field, code):
    spec = _write(tmp_path, f"name: b\ntargets: {{cpu: {{}}, h100: {override}}}\n")
    problems = _problems(spec, "cpu")
    assert [(p.field, p.code) for p in problems] == [(field, code)]
    assert problems[0].fix


def test_shared_and_override_problems_come_together_and_the_shared_one_once(tmp_path):
    spec = _write(tmp_path, "name: b\nlimits: {max_seq_len: 1}\n"
                            "targets: {cpu: {}, h100: {limits: {max_input_len: 0}}, h200: {serving: {http_port: 0}}}\n")
    fields = [p.field for p in _problems(spec, "cpu")]
    assert sorted(fields) == ["limits.max_seq_len", "targets.h100.limits.max_input_len",
                              "targets.h200.serving.http_port"]


def test_an_override_may_fix_a_shared_value_it_replaces(tmp_path):
    spec = _write(tmp_path, "name: b\nlimits: {max_batch_size: 8}\ntargets: {cpu: {}, h100: {limits: {max_batch_size: 64}}}\n")
    assert load_spec(spec, "cpu").settings.limits.max_batch_size == 8
    assert load_spec(spec, "h100").settings.limits.max_batch_size == 64


ALIASES = [
    ("parallelism", "tensor_parallel", "tp_size"), ("parallelism", "tensor_parallel_size", "tp_size"),
    ("parallelism", "tp", "tp_size"), ("parallelism", "pipeline_parallel", "pp_size"),
    ("parallelism", "pipeline_parallel_size", "pp_size"), ("parallelism", "pp", "pp_size"),
    ("parallelism", "expert_parallel", "moe_ep_size"), ("parallelism", "expert_parallel_size", "moe_ep_size"),
    ("parallelism", "ep", "moe_ep_size"), ("limits", "max_tokens", "max_num_tokens"),
    ("limits", "block_size", "tokens_per_block"), ("quantization", "algo", "quant_algo"),
    ("quantization", "quant", "quant_algo"),
]


@pytest.mark.parametrize("section,alias,key", ALIASES, ids=[a for _, a, _ in ALIASES])
def test_common_alias_gets_the_key_it_stands_for(tmp_path, section, alias, key):
    value = "fp8" if section == "quantization" else 2
    shared = _problems(_write(tmp_path, f"name: b\n{section}: {{{alias}: {value}}}\n"), "cpu")
    assert [(p.field, p.code) for p in shared] == [(f"{section}.{alias}", "unknown_key")]
    assert f"Did you mean '{key}'?" in shared[0].fix
    override = _problems(_write(tmp_path, f"name: b\ntargets: {{cpu: {{{section}: {{{alias}: {value}}}}}}}\n"), "cpu")
    assert [p.field for p in override] == [f"targets.cpu.{section}.{alias}"]
    assert f"Did you mean '{key}'?" in override[0].fix
