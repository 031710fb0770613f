"""The rules of ``lora`` (builders/lora.py), each on a build file with real PEFT adapters made here by peft's own API
on the tiny Llama: every problem named with its field and code, all at once, before any weight is read; and the
plan's adapter bytes from the adapters' headers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.lora import adapter_bytes, read_adapters
from builders.plan import read_hf_config
from builders.preflight import make_plan
from builders.spec import load_spec
from plugins.errors import SpecError
from plugins.targets import get_target
from tests.conftest import make_peft_adapter, tiny_llama_model, write_spec


def _adapter(model, out: Path, **cfg) -> Path:
    return make_peft_adapter(model, out, seed=1, **cfg)


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    """Adapters of the tiny Llama (hidden 64): good ones, DoRA, one on the embedding, and one of another base."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora-rules")
    base = lambda: AutoModelForCausalLM.from_pretrained(str(tiny_llama))  # noqa: E731
    return {
        "good": _adapter(base(), root / "good", r=4, alpha=8, modules=["q_proj", "v_proj"]),
        "wide": _adapter(base(), root / "wide", r=16, alpha=16,
                         modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        "dora": _adapter(base(), root / "dora", r=4, modules=["q_proj"], use_dora=True),
        "embed": _adapter(base(), root / "embed", r=4, modules=["q_proj", "embed_tokens"]),
        "other": _adapter(tiny_llama_model(hidden=32, intermediate=64), root / "other", r=4,
                          modules=["q_proj", "v_proj"]),
    }


def _spec(tmp_path: Path, model: Path, lora: str, *, quant="none", serving="", name="tiny") -> Path:
    spec = write_spec(tmp_path / "b.yaml", model, target="cpu", runtime="pytorch", quant=quant,
                      extra=f"lora:\n{lora}\n{serving}")
    return spec if name == "tiny" else spec.write_text(spec.read_text().replace("name: tiny", f"name: {name}")) or spec


def _codes(spec: Path, model: Path) -> list[tuple[str, str]]:
    build = load_spec(spec, "cpu")
    try:
        make_plan(build, get_target("cpu"), read_hf_config(model))
    except SpecError as exc:
        return [(p.field, p.code) for p in exc.problems]
    return []


def _adapters_block(**named: Path) -> str:
    return "  adapters:\n" + "".join(f"    {k}: {v}\n" for k, v in named.items())


CASES = {
    "missing folder": (lambda a, t: _adapters_block(x=t / "nowhere"), [("lora.adapters.x", "lora_adapter_missing")]),
    "dora": (lambda a, t: _adapters_block(d=a["dora"]), [("lora.adapters.d (adapter_config.json: use_dora)",
                                                          "lora_variant")]),
    "embedding": (lambda a, t: _adapters_block(e=a["embed"]), [("lora.adapters.e (adapter_model.safetensors)",
                                                                "lora_target_module")]),
    "other base": (lambda a, t: _adapters_block(o=a["other"]), [("lora.adapters.o", "lora_base")]),
    "rank": (lambda a, t: _adapters_block(w=a["wide"]) + "  max_lora_rank: 8\n", [("lora.max_lora_rank",
                                                                                   "lora_rank")]),
    "bad name": (lambda a, t: _adapters_block(**{"fr fr": a["good"]}), [("lora.adapters.fr fr", "lora_name")]),
    "base name": (lambda a, t: _adapters_block(tiny=a["good"]), [("lora.adapters.tiny", "lora_name")]),
    "cache slots": (lambda a, t: _adapters_block(g=a["good"]) + "  max_loras: 8\n  max_cpu_loras: 2\n",
                    [("lora.max_cpu_loras", "lora_cache")]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_names_its_field(case, adapters, tiny_llama, tmp_path):
    block, expected = CASES[case]
    spec = _spec(tmp_path, tiny_llama, block(adapters, tmp_path))
    assert _codes(spec, tiny_llama) == expected


def test_refused_combinations(adapters, tiny_llama, tmp_path):
    block = _adapters_block(g=adapters["good"])
    assert ("quantization.quant_algo", "lora_quant") in _codes(_spec(tmp_path, tiny_llama, block, quant="int8_sq"),
                                                                tiny_llama)
    reuse = "serving: {enable_kv_cache_reuse: true}"
    assert _codes(_spec(tmp_path, tiny_llama, block, serving=reuse), tiny_llama) == [
        ("serving.enable_kv_cache_reuse", "lora_kv_reuse")]


def test_good_adapters_plan_their_bytes(adapters, tiny_llama, tmp_path):
    """The plan's bytes per adapter are r x (in + out) x 4 bytes (float32 on CPU) over the tensors the file holds,
    and the LoRA cache is what the portable runtime holds: every adapter stacked per layer."""
    from safetensors import safe_open

    spec = _spec(tmp_path, tiny_llama, _adapters_block(g=adapters["good"], w=adapters["wide"]))
    assert _codes(spec, tiny_llama) == []
    plan = make_plan(load_spec(spec, "cpu"), get_target("cpu"), read_hf_config(tiny_llama))
    for entry, folder in zip(plan.lora.adapters, (adapters["good"], adapters["wide"])):
        with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
            stored = sum(f.get_tensor(k).numel() for k in f.keys()) * 4
        assert entry.bytes_per_rank == stored
    assert [a.task_id for a in plan.lora.adapters] == [1, 2] and plan.lora.max_lora_rank == 16
    # the portable runtime holds both adapters, stacked per layer at the largest rank (16) on the modules any adapts
    assert plan.memory.lora_cache_bytes == plan.lora.gpu_cache_bytes == 2 * plan.lora.slot_bytes
    assert plan.lora.host_cache_bytes == 0
    read, _ = read_adapters({"w": str(adapters["wide"])})
    assert adapter_bytes(read[0], 2, tp=2) < adapter_bytes(read[0], 2)  # sharded like the base


def test_every_problem_at_once_before_any_stage(adapters, tiny_llama, tmp_path):
    """One build file with four problems: `trtpipe build` names all four and exits 2 before any stage writes."""
    block = (_adapters_block(d=adapters["dora"], o=adapters["other"], w=adapters["wide"])
             + "  max_lora_rank: 8\n  max_loras: 8\n  max_cpu_loras: 2\n")
    spec = _spec(tmp_path, tiny_llama, block)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "build", str(spec), "--target", "cpu", "--out",
                           str(out), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    for text in ("use_dora", "lora.adapters.o", "lora.max_lora_rank", "lora.max_cpu_loras"):
        assert text in proc.stderr, (text, proc.stderr)
    assert not any(out.rglob("stage.json"))


def test_adapter_table_written_for_the_runtimes(adapters, tmp_path):
    from builders.lora import write_adapters

    read, problems = read_adapters({"g": str(adapters["good"]), "w": str(adapters["wide"])})
    assert not problems
    table = write_adapters(read, tmp_path)
    assert json.loads((tmp_path / "lora" / "adapters.json").read_text()) == table
    assert [(e["name"], e["task_id"], e["path"], e["scaling"]) for e in table] == [("g", 1, "lora/g", 2.0),
                                                                                  ("w", 2, "lora/w", 1.0)]
    assert (tmp_path / "lora" / "w" / "adapter_model.safetensors").read_bytes() == \
        (adapters["wide"] / "adapter_model.safetensors").read_bytes()
