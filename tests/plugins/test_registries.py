"""The registries agree with what they name: templates, target profiles, ModelOpt configs, the spec."""

from __future__ import annotations

import typing

import pytest

from builders.spec import BuildSettings, QuantizationConfig
from model_repo.generate import TEMPLATES
from plugins.architectures import ARCHITECTURES, architecture
from plugins.recipes import QUANT_RECIPES
from plugins.runtimes import RUNTIMES, kv_slots
from plugins.targets import registry


def test_spec_choices_are_the_registry_keys():
    assert typing.get_args(BuildSettings.model_fields["runtime"].annotation) == tuple(RUNTIMES)
    assert typing.get_args(QuantizationConfig.model_fields["quant_algo"].annotation) == tuple(QUANT_RECIPES)


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_each_runtime_has_its_template_and_engine_stage(name):
    from pipeline.build import ENGINE_STAGES

    rt = RUNTIMES[name]
    assert (TEMPLATES / rt.template / "config.pbtxt").is_file()
    assert rt.engine in ENGINE_STAGES
    assert not rt.builds_trt_engine or rt.sharded  # a TensorRT engine is always sharded over tp x pp


def test_every_target_names_known_runtimes():
    for target in registry().values():
        assert set(target.runtimes) <= set(RUNTIMES), target.name


@pytest.mark.slow  # imports ModelOpt
@pytest.mark.parametrize("name", sorted(QUANT_RECIPES))
def test_each_recipe_names_a_modelopt_config(name):
    import modelopt.torch.quantization as mtq

    cfg = QUANT_RECIPES[name].modelopt_cfg
    assert cfg is None or isinstance(getattr(mtq, cfg), dict)
    r = QUANT_RECIPES[name]
    if r.algorithm is not None:  # a calibration algorithm of ModelOpt's, valid for the config it replaces
        from modelopt.torch.quantization.mode import CalibrateModeRegistry

        from builders.quantize import modelopt_config
        from plugins.recipes import ALGORITHMS

        assert cfg is not None and r.algorithm in ALGORITHMS
        algo = modelopt_config(name, 128)["algorithm"]
        mode = CalibrateModeRegistry.get(f"{algo['method']}_calibrate")  # as ModelOpt 0.47 mode.py finds it
        assert mode.config_class(**algo).method == r.algorithm


def test_recipe_bytes_follow_their_traits():
    # 4096 x 4096 shard, group 128: INT4 AWQ = 0.5 B/param + fp32 per-group scales (as ModelOpt 0.47 exports them)
    # + a 16-bit prequant scale
    w, s = QUANT_RECIPES["int4_awq"].linear_bytes(4096, 4096, 128, 2)
    assert w == 4096 * 4096 // 2 and s == 4096 * 32 * 4 + 4096 * 2
    w8, s8 = QUANT_RECIPES["w4a8_awq"].linear_bytes(4096, 4096, 128, 2)
    assert (w8, s8) == (w, s + 8)  # W4A8 adds the two per-tensor FP32 scales of its FP8 activations
    assert QUANT_RECIPES["int8_sq"].linear_bytes(4096, 1024, 128, 2) == (4096 * 1024, 1024 * 4 + 4)
    assert QUANT_RECIPES["none"].linear_bytes(4096, 1024, 128, 2) == (4096 * 1024 * 2, 0)


def test_unknown_architecture_is_none_and_known_ones_have_the_llama_shards():
    assert architecture("GPTNeoXForCausalLM") is None
    for arch in ARCHITECTURES.values():
        shards = arch.linear_shards(hidden_size=64, heads_rank=4, kv_heads_rank=2, head_dim=16, intermediate_rank=128)
        assert [(s.n_in, s.n_out) for s in shards] == [(64, 128), (64, 64), (64, 128), (64, 128), (128, 64)]


def test_kv_slots_one_rule():
    tokens, source = kv_slots(8, 2048)
    assert tokens == 8 * 2048 and "max_batch_size x max_seq_len" in source
    assert kv_slots(8, 2048, cap=1000)[0] == 1000
    assert kv_slots(8, 2048, pool_tokens=50000)[0] == 50000
    assert kv_slots(8, 2048, cap=1000, pool_tokens=50000)[0] == 1000  # the spec's cap wins


def test_a_bad_target_profile_is_named_with_its_fields(tmp_path):
    from plugins.errors import SpecError

    (tmp_path / "mygpu.yaml").write_text("name: mygpu\ncompute_capability: [9, 0]\nmemory_gib: 80\n"
                                         "memory_bandwidth_gbps: 3350\ngpus_per_node: 8\nruntimes: [trtllm]\nfoo: 1\n")
    with pytest.raises(SpecError) as err:
        registry(str(tmp_path))
    text = str(err.value)
    assert "problems in the target profiles" in text and "mygpu.yaml: kind" in text and "mygpu.yaml: foo" in text
    assert "Traceback" not in text


def test_fp8_support_follows_the_compute_capability():
    """FP8 is derived from the SM (plugins.resolve.SM_FP8_MIN), not stated beside it: the values the profiles'
    own fp8 flags held."""
    assert {name: t.fp8 for name, t in registry().items()} == {
        "a10": False, "a100-40gb": False, "a100-80gb": False, "b200": True, "cpu": False, "h100": True, "h200": True,
        "l4": True, "l40s": True}


def test_tensor_throughput_follows_the_compute_capability():
    """Every GPU profile states its dense tensor peak; FP8 where the SM has it, FP4 from Blackwell (SM 100) on, and
    FP8 / INT8 at twice FP16 (the datasheets' ratio on Ampere, Ada, Hopper and Blackwell)."""
    for name, t in registry().items():
        if t.kind == "cpu":
            assert t.tensor_tflops is None, name
            continue
        tc = t.tensor_tflops
        assert (tc.fp8 is not None) == t.fp8 and (tc.fp4 is not None) == (t.sm >= 100), name
        assert tc.int8 == pytest.approx(2 * tc.fp16, rel=0.02), name
        assert tc.fp8 is None or tc.fp8 == pytest.approx(2 * tc.fp16, rel=0.02), name


def test_family_paths_follow_the_recorded_trtllm_facts():
    """trtllm_build / llmapi traits = TensorRT-LLM 1.2.1's MODEL_MAP and PyTorch-backend registrations, as recorded
    from upstream (tests/facts/trtllm_1_2_1/model_families.json); the ModelOpt QWen name is in MODEL_MAP too."""
    import json
    from pathlib import Path

    facts = json.loads((Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "model_families.json")
                       .read_text())
    for arch in ARCHITECTURES.values():
        assert arch.trtllm_build == (arch.name in facts["engine_model_map"]), arch.name
        assert arch.llmapi == (arch.name in facts["pytorch_backend_architectures"]), arch.name
    assert "QWenForCausalLM" in facts["engine_model_map"]


def test_support_names_an_alternative_for_every_refusal():
    from plugins.architectures import support
    from plugins.runtimes import RUNTIMES

    for arch in ARCHITECTURES.values():
        for rt in RUNTIMES.values():
            for q in QUANT_RECIPES.values():
                v = support(arch, rt, q)
                assert v.ok or v.reason, (arch.name, rt.name, q.name)
                assert v.ok == (v.checkpoint_format in rt.checkpoint_formats), (arch.name, rt.name, q.name)
    # Gemma 2 only through the portable runtime; MoE INT4 nowhere
    gemma2 = ARCHITECTURES["Gemma2ForCausalLM"]
    assert support(gemma2, RUNTIMES["trtllm"], QUANT_RECIPES["fp8"]).instead == ("pytorch",)
    mixtral = ARCHITECTURES["MixtralForCausalLM"]
    assert not any(support(mixtral, rt, QUANT_RECIPES["int4_awq"]).ok for rt in RUNTIMES.values())


def test_llm_api_arg_sets_are_the_recorded_facts():
    """plugins/llmapi_args.py = the fields recorded from tensorrt_llm/llmapi/llm_args.py of each release."""
    import json
    from pathlib import Path

    from plugins.llmapi_args import LLM_API_ARGS

    facts_dir = Path(__file__).resolve().parents[1] / "facts"
    for version, folder in (("1.2.1", "trtllm_1_2_1"), ("1.4", "trtllm_1_4")):
        facts = json.loads((facts_dir / folder / "llm_args.json").read_text())
        args = LLM_API_ARGS[version]
        assert args.fields == set(facts["torch_llm_args"]), version
        assert args.trt_only == set(facts["trt_only_fields"]), version
        assert args.nested["kv_cache_config"] == set(facts["kv_cache_config"]), version
        assert args.nested["scheduler_config"] == set(facts["scheduler_config"]) - {"serve_default"}, version
        assert args.nested["cuda_graph_config"] == set(facts["cuda_graph_config"]) - {"class", "encode_fields",
                                                                                      "rules"}, version
        assert facts["source"]["commit_llm_args"].startswith(args.source.split("@")[1].split()[0]), version
        assert args.guided_decoding_backends == set(facts["guided_decoding_backends"]), version
        # speculative_config: the base class's fields (and their aliases) + each subclass's own, per decoding_type
        spec = facts["speculative"]
        base = spec["DecodingBaseConfig"]["fields"]
        base_keys = set(base) | {a for f in base.values() for a in f.get("aliases", [])} | {"decoding_type"}
        found = set()
        for entry in spec.values():
            if not isinstance(entry, dict) or entry.get("decoding_type") not in args.speculative:
                continue
            own = set(entry["fields"])
            if "<all EagleDecodingConfig fields>" in own:
                own = own - {"<all EagleDecodingConfig fields>"} | set(spec["EagleDecodingConfig"]["fields"])
            assert args.speculative[entry["decoding_type"]] == base_keys | own, (version, entry["decoding_type"])
            found.add(entry["decoding_type"])
        assert found == set(args.speculative), version
