"""LoRA on the trtllm-llmapi runtime: the engine folder's adapters and table, and the LLM-API lora_config per release.

Real PEFT adapters (peft's get_peft_model, init_lora_weights=False) on a tiny Llama built from transformers' config
class; nothing is downloaded. The option names are checked against the facts recorded from TensorRT-LLM
(tests/facts/trtllm_*/lora_llmapi.json) through builders.llmapi_options.option_problems.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from builders.llmapi_options import RELEASES, llm_api_options, option_problems, options_files
from builders.lora import adapters_digest, read_adapters
from builders.preflight import make_plan
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import make_peft_adapter, write_spec
from tests.families import save_tiny


def make_adapter(base: Path, out: Path, r: int, modules: list[str], seed: int = 0) -> Path:
    """tests/conftest.py make_peft_adapter with lora_alpha 2r."""
    return make_peft_adapter(base, out, r=r, modules=modules, seed=seed)


@pytest.fixture(scope="module")
def tiny_with_adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_llmapi")
    base = save_tiny("LlamaForCausalLM", root / "base")
    (base / "generation_config.json").write_text('{"eos_token_id": 2}')
    a = make_adapter(base, root / "ad-a", 4, ["q_proj", "v_proj"], seed=1)
    b = make_adapter(base, root / "ad-b", 8, ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"], seed=2)
    return root, base, a, b


def _build(tmp_path, base, adapters: dict, lora_extra: str = ""):
    lines = "\n".join(f"    {k}: {v}" for k, v in adapters.items())
    extra = f"lora:\n  adapters:\n{lines}\n{lora_extra}"
    return load_spec(write_spec(tmp_path / "b.yaml", base, runtime="trtllm-llmapi", extra=extra), "h100")


def test_engine_folder_holds_the_adapters_and_their_table(tmp_path, tiny_with_adapters):
    from pipeline.build import llmapi_engine_stage
    from pipeline.cache import StageResult

    _, base, a, b = tiny_with_adapters
    build = _build(tmp_path, base, {"sql": a, "chat-v2": b})
    plan = make_plan(build, get_target("h100"), json.loads((base / "config.json").read_text()))
    ctx = types.SimpleNamespace(build=build, plan=plan, out=tmp_path / "out", hf_dir=base, force=False)
    ckpt = StageResult("checkpoint", base, "ckptkey", False)
    engine = llmapi_engine_stage(ctx, ckpt)
    table = json.loads((engine.path / "lora" / "adapters.json").read_text())
    assert [{k: e[k] for k in ("name", "task_id", "path", "rank")} for e in table] == [
        {"name": "sql", "task_id": 1, "path": "lora/sql", "rank": 4},
        {"name": "chat-v2", "task_id": 2, "path": "lora/chat-v2", "rank": 8}]
    for entry, src in zip(table, (a, b)):
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            assert (engine.path / entry["path"] / name).read_bytes() == (src / name).read_bytes()
    assert (engine.path / "config.json").is_file() and engine.info["lora_adapters"] == table
    assert llmapi_engine_stage(ctx, ckpt).cached  # same inputs: reused


def test_an_adapter_retrained_in_place_rebuilds_the_engine_folder(tmp_path, tiny_with_adapters):
    from pipeline.build import llmapi_engine_stage
    from pipeline.cache import StageResult

    root, base, a, _ = tiny_with_adapters
    moved = make_adapter(base, tmp_path / "ad", 4, ["q_proj", "v_proj"], seed=1)
    build = _build(tmp_path, base, {"sql": moved})
    plan = make_plan(build, get_target("h100"), json.loads((base / "config.json").read_text()))
    ctx = types.SimpleNamespace(build=build, plan=plan, out=tmp_path / "out", hf_dir=base, force=False)
    ckpt = StageResult("checkpoint", base, "ckptkey", False)
    first = llmapi_engine_stage(ctx, ckpt)
    digest = adapters_digest(read_adapters({"sql": str(moved)})[0])
    make_adapter(base, moved, 4, ["q_proj", "v_proj"], seed=7)  # same folder, same spec, new weights
    assert adapters_digest(read_adapters({"sql": str(moved)})[0]) != digest
    second = llmapi_engine_stage(ctx, ckpt)
    assert not second.cached and second.key != first.key
    assert ((second.path / "lora" / "sql" / "adapter_model.safetensors").read_bytes()
            == (moved / "adapter_model.safetensors").read_bytes())


def test_adapters_digest_covers_both_files_and_the_order(tiny_with_adapters):
    _, _, a, b = tiny_with_adapters
    one = read_adapters({"x": str(a), "y": str(b)})[0]
    swapped = read_adapters({"x": str(b), "y": str(a)})[0]
    assert len(adapters_digest(one)) == 64 and adapters_digest(one) != adapters_digest(swapped)
    assert adapters_digest(one) == adapters_digest(list(reversed(one)))  # task-id order, not list order


def _plan(build, base):
    return make_plan(build, get_target("h100"), json.loads((base / "config.json").read_text()))


@pytest.mark.parametrize("release", RELEASES)
def test_options_carry_lora_config_and_pass_every_release(tmp_path, tiny_with_adapters, release):
    _, base, a, b = tiny_with_adapters
    build = _build(tmp_path, base, {"sql": a, "chat-v2": b}, "  max_loras: 2\n  max_cpu_loras: 6\n")
    plan = _plan(build, base)
    engine = tmp_path / "engine"
    options = llm_api_options(build, plan, release, engine_dir=engine)
    lora = options["lora_config"]
    assert lora == {"max_lora_rank": 8, "max_loras": 2, "max_cpu_loras": 6,
                    "lora_target_modules": ["mlp_4h_to_h", "attn_k", "attn_dense", "attn_q", "attn_v"],
                    "lora_dir": [str(engine.resolve() / "lora" / "sql"), str(engine.resolve() / "lora" / "chat-v2")]}
    assert "enable_lora" not in options  # the PyTorch backend ignores it beside lora_config (the facts)
    assert option_problems(options, releases=[release]) == []
    # without a plan (deployment files) the adapters' headers give the same rank and modules
    assert llm_api_options(build, None, release, engine_dir=engine)["lora_config"] == lora


def test_a_misspelt_lora_option_is_refused_per_release(tmp_path, tiny_with_adapters):
    _, base, a, _ = tiny_with_adapters
    build = _build(tmp_path, base, {"sql": a})
    options = llm_api_options(build, _plan(build, base))
    options["lora_config"]["max_lora_ranks"] = 8
    options["lora_config"]["cuda_graph_specialize_lora"] = True  # a 1.4 field 1.2.1 lacks
    problems = option_problems(options)
    refused = {(p.field.rsplit(".", 1)[1], p.rule.split("'")[0]) for p in problems}
    assert refused == {("max_lora_ranks", "TensorRT-LLM 1.2.1"), ("max_lora_ranks", "TensorRT-LLM 1.4"),
                       ("cuda_graph_specialize_lora", "TensorRT-LLM 1.2.1")}
    assert all(p.field.startswith("serving.llm_api_options.lora_config.") for p in problems)


def test_no_adapters_no_lora_config(tmp_path, tiny_with_adapters):
    _, base, _, _ = tiny_with_adapters
    build = load_spec(write_spec(tmp_path / "b.yaml", base, runtime="trtllm-llmapi"), "h100")
    assert "lora_config" not in llm_api_options(build)


def test_the_repository_options_file_and_model_config_name_the_adapters(tmp_path, tiny_with_adapters):
    """The options YAML Triton's model and trtllm-serve read has lora_config with lora_dir in the engine folder;
    the llmapi model declares the C++ backend's lora_task_id (UINT64 [1], optional) only with adapters."""
    import yaml

    from model_repo.generate import plan_repository, write_repository

    _, base, a, _ = tiny_with_adapters
    engine = tmp_path / "engine"
    for with_lora in (True, False):
        build = (_build(tmp_path, base, {"sql": a}) if with_lora else
                 load_spec(write_spec(tmp_path / "b.yaml", base, runtime="trtllm-llmapi"), "h100"))
        repo = plan_repository(build, get_target("h100"), _plan(build, base), engine, tokenizer_dir=base,
                               engine_built=False)
        out = tmp_path / f"repo-{with_lora}"
        write_repository(repo, out)
        config = (out / "tensorrt_llm" / "config.pbtxt").read_text()
        declared = 'name: "lora_task_id" data_type: TYPE_UINT64 dims: [ 1 ] optional: true' in config
        assert declared and config.count('"lora_task_id"') == 1  # upstream's input, declared on every build
        for name in options_files(build, None, engine):
            options = yaml.safe_load((out / "tensorrt_llm" / "1" / name).read_text())
            assert (options.get("lora_config", {}).get("lora_dir") == [str(engine.resolve() / "lora" / "sql")]) \
                is with_lora
