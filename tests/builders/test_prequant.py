"""Pre-quantized sources (builders/prequant.py): each format made by the library that owns it (tests/prequant_formats.py),
recognised from its config, read back to the weights its producer meant, adopted by the build, and refused by the
runtimes that cannot read it as upstream says (tests/facts/*/prequantized.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from builders import prequant
from builders.checkpoint import read_checkpoint
from builders.spec import load_spec
from plugins.errors import SpecError
from tests.conftest import tiny_llama_model
from tests.prequant_formats import (reference_awq, write_awq, write_compressed_fp8, write_gptq)

FACTS = Path(__file__).resolve().parents[1] / "facts"


def _model():
    return tiny_llama_model(vocab=256, tie=False)


def _linears(sd: dict) -> list[str]:
    return [k for k in sd if ".layers." in k and k.endswith("_proj.weight")]


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    root = tmp_path_factory.mktemp("prequant")
    return {"awq": write_awq(_model(), root / "awq", group_size=32),
            "gptq": write_gptq(_model(), root / "gptq", group_size=32),
            "gptq_v2": write_gptq(_model(), root / "gptq_v2", group_size=32, checkpoint_format="gptq_v2"),
            "gptq_desc_act": write_gptq(_model(), root / "gptq_da", group_size=32, desc_act=True),
            **{f"fp8_{s}": write_compressed_fp8(_model(), root / f"fp8_{s}", strategy=s)
               for s in ("tensor", "channel", "block")}}


# ---------------------------------------------------------------------------------------------------- detection

@pytest.mark.parametrize("name, method, algo, recipe, group", [
    ("awq", "awq", "W4A16_GPTQ", "int4_awq", 32),  # TensorRT-LLM's name for INT4 with zero points
    ("gptq", "gptq", "W4A16_GPTQ", None, 32),
    ("fp8_tensor", "compressed-tensors", "FP8", "fp8", None),
    ("fp8_channel", "compressed-tensors", "FP8_PER_CHANNEL_PER_TOKEN", "fp8", None),
    ("fp8_block", "compressed-tensors", "FP8_BLOCK_SCALES", "fp8", None),
])
def test_each_format_is_recognised_from_its_config(formats, name, method, algo, recipe, group):
    pq = prequant.detect_folder(formats[name])
    assert (pq.method, pq.quant_algo, pq.group_size) == (method, algo, group)
    if recipe:
        assert pq.recipe == recipe


def test_an_unquantized_checkpoint_is_not_prequantized(tmp_path):
    _model().save_pretrained(tmp_path)
    assert prequant.detect_folder(tmp_path) is None


@pytest.mark.parametrize("config, words", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv", "group_size": 128}, "version 'gemv'"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits 8"),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, "'MIXED_PRECISION'"),
])
def test_a_quantization_trtpipe_does_not_read_is_refused_by_name(config, words):
    with pytest.raises(SpecError) as err:
        prequant.detect({"quantization_config": config, "_name_or_path": "org/model"})
    p = err.value.problems[0]
    assert p.code == "prequant_format" and words in p.rule and "unquantized original" in p.fix


def test_compressed_tensors_int4_is_refused_as_not_fp8(formats, tmp_path):
    """compressed-tensors' own AutoAWQ converter writes an INT4 pack-quantized checkpoint: recognised, refused."""
    from compressed_tensors.entrypoints.convert.convert_checkpoint import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    convert_checkpoint(formats["awq"], tmp_path / "ct", AutoAWQConverter.from_pretrained(str(formats["awq"])),
                       max_workers=1, device="cpu")
    with pytest.raises(SpecError) as err:
        prequant.detect_folder(tmp_path / "ct")
    assert "int 4-bit" in err.value.problems[0].rule and "FP8 checkpoints only" in err.value.problems[0].rule


# ---------------------------------------------------------------------------------------------------- reading back

def test_awq_reads_back_as_compressed_tensors_and_transformers_read_it(formats, tmp_path):
    """The AutoAWQ checkpoint converted by compressed-tensors' own AutoAWQ converter and loaded by transformers
    (dequantized) has the weights trtpipe reads from the AutoAWQ files: an independent reading of the packing."""
    from compressed_tensors.entrypoints.convert.convert_checkpoint import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    ours, info = read_checkpoint(formats["awq"])
    assert info.quant_algo == "W4A16_GPTQ" and info.format == "hf_awq"
    convert_checkpoint(formats["awq"], tmp_path / "ct", AutoAWQConverter.from_pretrained(str(formats["awq"])),
                       max_workers=1, device="cpu")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "ct", dtype=torch.float32,
                                                  quantization_config=CompressedTensorsConfig(dequantize=True))
    sd = theirs.state_dict()
    names = _linears(ours)
    assert len(names) == 14
    for k in names:
        torch.testing.assert_close(ours[k], sd[k].float(), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["gptq", "gptq_v2", "gptq_desc_act"])
def test_gptq_reads_back_to_its_integer_grid(formats, name):
    """(q - z) * s[g_idx] per layer: the grid the writer quantized to (v1 zeros stored minus one, v2 as they are,
    desc_act groups through g_idx), within half a step of the float weights."""
    ours, info = read_checkpoint(formats[name])
    assert info.quant_algo == "W4A16_GPTQ"
    model = _model()
    float_sd = model.state_dict()
    if name != "gptq_desc_act":
        grid = reference_awq(model, 32)  # the same asymmetric grid, groups in input order
        for k, v in grid.items():
            torch.testing.assert_close(ours[k], v, atol=1e-3, rtol=1e-3)
    for k in _linears(ours):
        step = (float_sd[k].abs().max() * 2 / 15).item()
        assert (ours[k] - float_sd[k]).abs().max().item() <= step / 2 + 1e-3, k


def test_gptq_without_g_idx_and_per_channel_groups():
    """g_idx absent: input i is in group i // group_size; group_size -1: one group over every input."""
    from tests.prequant_formats import asym_int4, pack_cols, pack_rows

    w = torch.randn(16, 64)
    for group in (32, 64):
        q, s, z, g = asym_int4(w, group)
        t = {"l.qweight": pack_rows(q), "l.qzeros": pack_cols(z - 1), "l.scales": s}
        out = prequant.dequantize_gptq(t, "l", group if group < 64 else None)
        torch.testing.assert_close(out, ((q - z[g.long()]) * s.float()[g.long()]).T)


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_compressed_tensors_fp8_reads_back_as_transformers_loads_it(formats, strategy):
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    ours, info = read_checkpoint(formats[f"fp8_{strategy}"])
    theirs = AutoModelForCausalLM.from_pretrained(formats[f"fp8_{strategy}"], dtype=torch.float32,
                                                  quantization_config=CompressedTensorsConfig(dequantize=True))
    sd = theirs.state_dict()
    for k in _linears(ours):
        torch.testing.assert_close(ours[k], sd[k].float(), atol=0, rtol=0)
    float_sd = _model().state_dict()
    assert max((ours[k] - float_sd[k]).abs().max().item() for k in _linears(ours)) > 0  # really FP8


def test_fp8_block_scales_follow_the_block_structure_not_the_shape():
    """300 rows in blocks of 128 are 3 scale rows; inferring the block from the shape (100) would be wrong."""
    w = torch.randn(300, 256)
    s = torch.rand(3, 2) + 0.5
    t = {"l.weight": w.to(torch.float8_e4m3fn), "l.weight_scale": s}
    out = prequant.dequantize_fp8(t, "l", [128, 128])
    assert torch.allclose(out[127, :128], t["l.weight"][127, :128].float() * s[0, 0])
    assert torch.allclose(out[128, :128], t["l.weight"][128, :128].float() * s[1, 0])
    assert torch.allclose(out[299, 128:], t["l.weight"][299, 128:].float() * s[2, 1])


def test_a_missing_scale_is_a_stage_error_naming_the_tensor(formats, tmp_path):
    from safetensors.torch import load_file, save_file

    from plugins.errors import StageError

    bad = tmp_path / "awq"
    shutil.copytree(formats["awq"], bad)
    t = load_file(bad / "model.safetensors")
    del t["model.layers.1.mlp.up_proj.scales"]
    save_file(t, bad / "model.safetensors")
    with pytest.raises(StageError, match="model.layers.1.mlp.up_proj.scales"):
        read_checkpoint(bad)


def test_headers_map_to_the_float_model_so_a_missing_layer_is_found(formats, tmp_path):
    """The plan-time tensor check reads headers only: the AWQ checkpoint passes, one with a layer removed is named."""
    from safetensors.torch import load_file, save_file

    from builders.source_tensors import checkpoint_problems

    pq = prequant.detect_folder(formats["awq"])
    assert checkpoint_problems(formats["awq"], prequantized=pq) == []
    bad = tmp_path / "awq"
    shutil.copytree(formats["awq"], bad)
    t = load_file(bad / "model.safetensors")
    for suffix in ("qweight", "qzeros", "scales"):
        del t[f"model.layers.0.self_attn.o_proj.{suffix}"]
    save_file(t, bad / "model.safetensors")
    problems = checkpoint_problems(bad, prequantized=pq)
    assert [p.code for p in problems] == ["checkpoint_missing"]
    assert "model.layers.0.self_attn.o_proj.weight" in problems[0].rule


# ---------------------------------------------------------------------------------------------------- the build file

def _spec(tmp_path, source: Path, extra: str = "", runtime: str = "pytorch", target: str = "cpu"):
    p = tmp_path / "b.yaml"
    p.write_text(f"name: pq\nmodel: {{source: {source}}}\n{extra}\ntargets:\n  {target}: {{runtime: {runtime}}}\n")
    return load_spec(p, target)


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_a_build_file_without_quant_algo_takes_the_checkpoints(formats, tmp_path):
    build, pq = prequant.source_quantization(_spec(tmp_path, formats["awq"]), _config(formats["awq"]), formats["awq"])
    q = build.settings.quantization
    assert (pq.method, q.quant_algo, q.group_size) == ("awq", "int4_awq", 32)


def test_a_build_file_asking_another_recipe_is_refused_naming_both(formats, tmp_path):
    build = _spec(tmp_path, formats["awq"], "quantization: {quant_algo: fp8, group_size: 64}")
    with pytest.raises(SpecError) as err:
        prequant.source_quantization(build, _config(formats["awq"]), formats["awq"])
    codes = {p.code: p for p in err.value.problems}
    assert set(codes) == {"prequant_recipe", "prequant_group_size"}
    p = codes["prequant_recipe"]
    assert p.field == "quantization.quant_algo" and p.value == "fp8"
    assert "AutoAWQ W4A16_GPTQ" in p.rule and "int4_awq" in p.fix and "unquantized model" in p.fix
    assert "32" in codes["prequant_group_size"].rule


def test_naming_the_checkpoints_own_recipe_is_accepted(formats, tmp_path):
    build = _spec(tmp_path, formats["awq"], "quantization: {quant_algo: int4_awq}")
    build, pq = prequant.source_quantization(build, _config(formats["awq"]), formats["awq"])
    assert build.settings.quantization.quant_algo == "int4_awq"


def test_a_reference_for_an_unquantized_source_is_refused(tmp_path):
    _model().save_pretrained(tmp_path / "float")
    build = _spec(tmp_path, tmp_path / "float")
    build = build.model_copy(update={"model": build.model.model_copy(update={"reference": str(tmp_path)})})
    with pytest.raises(SpecError) as err:
        prequant.source_quantization(build, _config(tmp_path / "float"), tmp_path / "float")
    assert err.value.problems[0].code == "reference_unquantized"


# ---------------------------------------------------------------------------------------------------- runtimes

def _facts(name: str) -> dict:
    return json.loads((FACTS / name).read_text())


@pytest.mark.parametrize("name, runtime, refused", [
    ("awq", "pytorch", False), ("gptq", "pytorch", False), ("fp8_tensor", "pytorch", False),
    ("awq", "trtllm-llmapi", True), ("gptq", "trtllm-llmapi", True),
    ("fp8_tensor", "trtllm-llmapi", True),  # tensor-strategy weights: ValueError in _torch/model_config.py
    ("fp8_channel", "trtllm-llmapi", True),  # weights only: upstream reads channel weights with token activations
    ("awq", "trtllm", False), ("gptq", "trtllm", False),  # upstream's from_hugging_face converts them
    ("fp8_channel", "trtllm", True), ("gptq_desc_act", "trtllm", True), ("gptq_v2", "trtllm", True),
])
def test_each_runtime_takes_what_upstream_reads(formats, tmp_path, name, runtime, refused):
    build = _spec(tmp_path, formats[name], runtime=runtime, target="h100" if runtime != "pytorch" else "cpu")
    build, pq = prequant.source_quantization(build, _config(formats[name]), formats[name])
    problems = prequant.runtime_problems(build, pq, _config(formats[name]))
    assert bool(problems) == refused
    for p in problems:
        assert p.code == "prequant_runtime" and p.field.endswith("runtime") and "runtime: pytorch" in p.fix


def test_the_llmapi_rule_follows_the_recorded_compressed_tensors_facts():
    """The facts say which compressed-tensors FP8 shapes TensorRT-LLM's PyTorch backend maps to which QuantAlgo."""
    facts = json.dumps(_facts("trtllm_1_4/prequantized.json"))
    for word in ("FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES", "compressed-tensors"):
        assert word in facts
    ok = {"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
                                  "config_groups": {"group_0": {
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                            "dynamic": True}}}}}
    pq = prequant.detect(ok)
    assert pq.quant_algo == "FP8_PER_CHANNEL_PER_TOKEN" and pq.detail["input_activations"]["strategy"] == "token"


def test_modelopt_llmapi_formats_match_the_facts():
    facts = json.dumps(_facts("trtllm_1_2_1/prequantized.json"))
    for algo in filter(None, prequant.LLMAPI_MODELOPT):
        assert algo in facts


# ---------------------------------------------------------------------------------------------------- ModelOpt facts

def _recorded_modelopt():
    return _facts("modelopt_0_47/hf_export.json")["recipes"]


@pytest.mark.parametrize("recipe", sorted(_recorded_modelopt()))
def test_modelopt_exports_as_recorded_are_read_or_refused(recipe, tmp_path):
    """Every ModelOpt 0.47 export recorded (hf_quant_config.json and config.json as it wrote them): a quant_algo with
    a recipe here is recognised from either file, the others are refused by name; its tensors map onto the float
    model's shapes."""
    rec = _recorded_modelopt()[recipe]
    if "hf_quant_config.json" not in rec:
        pytest.skip(f"{recipe}: ModelOpt could not export it on CPU (recorded as a failure)")
    algo = rec["hf_quant_config.json"]["quantization"]["quant_algo"]
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(rec["hf_quant_config.json"]))
    config = {"quantization_config": rec["config.json quantization_config"]}
    if algo not in prequant.MODELOPT_RECIPES:
        with pytest.raises(SpecError, match=repr(algo)):
            prequant.detect(config, tmp_path)
        return
    from_folder, from_config = prequant.detect(config, tmp_path), prequant.detect(config)
    assert from_folder.quant_algo == from_config.quant_algo == algo
    assert from_folder.declared_in == "hf_quant_config.json" and from_config.declared_in == "config.json"
    kv = rec["hf_quant_config.json"]["quantization"].get("kv_cache_quant_algo")
    assert from_folder.kv_cache_quant_algo == ("fp8" if kv == "FP8" else None)
    headers = {k: (tuple(v["shape"]), {"float8_e4m3fn": "F8_E4M3", "uint8": "U8", "int8": "I8"}.get(
        v["dtype"], "BF16"), "model.safetensors") for k, v in rec["tensors_layer0_and_nonlayer"].items()}
    shapes = {k: v[0] for k, v in prequant.float_headers(from_folder, headers).items()}
    assert shapes["model.layers.0.mlp.down_proj.weight"][0] == shapes["model.embed_tokens.weight"][1]
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (shapes["model.embed_tokens.weight"][1],) * 2
    assert not any(k.endswith(("_scale", "scale_2")) for k in shapes)


# ---------------------------------------------------------------------------------------------------- from the hub

def test_a_prequantized_hub_repository_is_planned_from_config_json_and_built_with_a_hub_reference(
        formats, tiny_llama, tmp_path, monkeypatch):
    """``trtpipe plan`` on a GPTQ repository of the hub (the double, huggingface_hub's real client) reads config.json
    alone and plans the checkpoint's quantization; the build downloads it and its hub reference, skips quantizing and
    verifies against the reference."""
    from pipeline.build import run_build
    from pipeline.cli import main
    from tests.builders.test_hub import use_hub
    from tests.hub_double import HubDouble, Repo, folder_files
    from tests.prequant_formats import copy_tokenizer
    from tests.conftest import smollm2_tokenizer_dir

    model = tiny_llama_model(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    gptq = write_gptq(model, tmp_path / "gptq", group_size=32, tokenizer_src=smollm2_tokenizer_dir())
    with HubDouble() as double:
        double.add(Repo("org/tiny-gptq")).commit(folder_files(gptq))
        double.add(Repo("org/tiny")).commit(folder_files(tiny_llama))
        use_hub(monkeypatch, tmp_path / "hf", double.url)
        monkeypatch.chdir(tmp_path)
        spec = tmp_path / "b.yaml"
        spec.write_text("name: hubq\nmodel: {source: org/tiny-gptq, reference: org/tiny}\n"
                        "limits: {max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"
                        "gates: {eval_samples: 2, eval_seq_len: 32}\n"
                        "targets: {cpu: {runtime: pytorch}}\n")
        assert main(["plan", str(spec), "--target", "cpu", "--no-predict", "--output", str(tmp_path / "p.json")]) == 0
        assert double.downloads() == ["config.json"]
        plan = json.loads((tmp_path / "p.json").read_text())
        assert plan["source_quantization"]["method"] == "gptq" and plan["source_quantization"]["group_size"] == 32
        manifest = run_build(load_spec(spec, "cpu"), out_root=tmp_path / "build", progress=False, stop_after="verify")
    assert manifest["source_checkpoint"]["quantization"]["quant_algo"] == "W4A16_GPTQ"
    assert manifest["source_checkpoint"]["repo_id"] == "org/tiny-gptq"
    verify = manifest["stages"]["verify"]["info"]
    assert "models--org--tiny" in verify["reference"] and verify["metrics"]["top1_agreement"] > 0.5


def test_the_plan_counts_the_checkpoints_own_bytes(formats, tmp_path):
    """On the TensorRT-LLM runtimes the weights row is the checkpoint's format: AutoGPTQ's 16-bit scale and zero
    per group (not ModelOpt's FP32 scales and pre-quant vector), compressed-tensors' per-channel FP32 scales."""
    from builders.plan import compute_plan
    from plugins.targets import get_target

    def plan(name, runtime):
        build = _spec(tmp_path, formats[name], runtime=runtime, target="h100")
        build, _ = prequant.source_quantization(build, _config(formats[name]), formats[name])
        return compute_plan(build, get_target("h100"), _config(formats[name]))

    gptq = plan("gptq", "trtllm")
    from plugins.recipes import QUANT_RECIPES

    # the tiny model: per layer q,k,v,o (64 in) and gate,up (64 in), down (128 in); 2 layers; group 32
    shards = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)]
    scales = 2 * sum(2 * (n_in // 32) * n_out * 2 for n_in, n_out in shards)
    assert gptq.memory.weights_breakdown["scales"] == scales
    modelopt = 2 * sum(QUANT_RECIPES["int4_awq"].linear_bytes(i, o, 32, 2)[1] for i, o in shards)
    assert modelopt != scales  # the recipe's layout would have planned other bytes
    fp8 = plan("fp8_channel", "trtllm-llmapi")
    assert fp8.memory.weights_breakdown["scales"] == 2 * sum(2 * o for _, o in shards)  # float16 scales


def test_a_modelopt_folder_with_hf_quant_config_only_is_recognised_at_plan_time(tmp_path):
    """Older ModelOpt exports write hf_quant_config.json and no quantization_config in config.json: the plan of the
    local folder (config.json read, nothing else) still finds it beside config.json."""
    from pipeline.cli import main

    from tests.conftest import smollm2_tokenizer_dir
    from tests.prequant_formats import copy_tokenizer

    _model().save_pretrained(tmp_path / "m")
    copy_tokenizer(smollm2_tokenizer_dir(), tmp_path / "m")
    rec = _recorded_modelopt()["FP8_DEFAULT_CFG"]
    (tmp_path / "m" / "hf_quant_config.json").write_text(json.dumps(rec["hf_quant_config.json"]))
    assert "quantization_config" not in _config(tmp_path / "m")
    spec = tmp_path / "b.yaml"
    spec.write_text(f"name: b\nmodel: {{source: {tmp_path / 'm'}}}\ntargets: {{cpu: {{runtime: pytorch}}}}\n")
    assert main(["plan", str(spec), "--target", "cpu", "--no-predict", "--output", str(tmp_path / "p.json")]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["source_quantization"]["declared_in"] == "hf_quant_config.json" and plan["quant_algo"] == "fp8"


def test_the_plan_warns_that_compressed_tensors_needs_tensorrt_llm_1_4(tmp_path):
    from builders.plan import compute_plan
    from plugins.targets import get_target

    model = _model()
    src = write_compressed_fp8(model, tmp_path / "ct", strategy="channel")
    cfg = _config(src)
    cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
        "num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}  # the FP8_DYNAMIC scheme
    for runtime, warned in (("trtllm-llmapi", True), ("pytorch", False)):
        build = _spec(tmp_path, src, runtime=runtime, target="h100")
        build, pq = prequant.source_quantization(build, cfg, src)
        assert prequant.runtime_problems(build, pq, cfg) == []
        plan = compute_plan(build, get_target("h100"), cfg)
        assert any("PR #10796" in w for w in plan.warnings) == warned


def test_a_refused_recipe_brings_no_problems_of_its_own(formats, tmp_path):
    """Asking int4_awq of an FP8 checkpoint is one problem (prequant_recipe), not also the default group size's
    divisibility rule of a recipe that will not be built; the plan's prediction uses the checkpoint's recipe."""
    from builders import preflight
    from plugins.targets import get_target

    src = formats["fp8_channel"]
    build = _spec(tmp_path, src, "quantization: {quant_algo: int4_awq}")
    with pytest.raises(SpecError) as err:
        preflight.make_plan(build, get_target("cpu"), _config(src))
    assert [p.code for p in err.value.problems] == ["prequant_recipe"]
    plan = preflight.make_plan(_spec(tmp_path, src), get_target("cpu"), _config(src))
    assert plan.quant_algo == "fp8" and plan.trtllm_quant_algo == "FP8_PER_CHANNEL_PER_TOKEN"


def test_a_reference_error_names_model_reference(tmp_path, monkeypatch):
    """A hub reference that cannot be fetched is model.reference's problem, not model.source's."""
    from builders.model_fetch import resolve_source
    from tests.builders.test_hub import use_hub
    from tests.hub_double import HubDouble

    with HubDouble() as double:
        use_hub(monkeypatch, tmp_path / "hf", double.url)
        monkeypatch.chdir(tmp_path)
        with pytest.raises(SpecError) as err:
            resolve_source("org/missing", field="model.reference", progress=False)
    assert err.value.fields() == ["model.reference"] and err.value.codes() == ["hub_not_found"]


def test_the_rules_refuse_before_the_reference_is_fetched(tmp_path, monkeypatch):
    """A build the rules refuse does not download model.reference first (a hub reference here: the hub cannot be
    reached, so fetching it would fail with the hub's error instead of the rule's)."""
    from pipeline.build import run_build

    from tests.conftest import smollm2_tokenizer_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = write_compressed_fp8(_model(), tmp_path / "fp8", strategy="tensor", tokenizer_src=smollm2_tokenizer_dir())
    build = _spec(tmp_path, src, runtime="trtllm", target="h100")
    build = build.model_copy(update={"model": build.model.model_copy(update={"reference": "org/unreachable"})})
    with pytest.raises(SpecError) as err:
        run_build(build, out_root=tmp_path / "out", progress=False)
    assert "prequant_runtime" in err.value.codes() and not any(c.startswith("hub_") for c in err.value.codes())
