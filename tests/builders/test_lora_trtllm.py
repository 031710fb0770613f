"""LoRA on the trtllm runtime, held to TensorRT-LLM 1.2.1's facts (tests/facts/trtllm_1_2_1/lora.json).

upstream's examples/hf_lora_convert.py imports tensorrt_llm (str_dtype_to_torch, torch_to_numpy, LoraManager,
load_state_dict), so it cannot run here: the expected arrays are computed from the recorded layout rules, on a real
PEFT adapter of a tiny Llama, without the converter's code (torch reads the tensors, the rules in lora.json say
how each row is made).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from builders import lora_trtllm as lt
from builders.lora import HF_TO_TRTLLM, adapter_bytes, adapters_digest, lora_problems, read_adapter
from builders.engine_trtllm import run_trtllm_build, trtllm_build_argv
from builders.preflight import make_plan
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import DOUBLE, make_peft_adapter, tiny_llama_model, write_spec

FACTS = Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1"
LORA = json.loads((FACTS / "lora.json").read_text())
BUILD = json.loads((FACTS / "trtllm_build.json").read_text())
BACKEND = json.loads((FACTS / "backend_parameters.json").read_text())["parameters"]


def make_adapter(out: Path, *, targets=("q_proj", "v_proj", "down_proj"), r=4, alpha=8, rslora=False,
                 seed=1) -> Path:
    """A real PEFT adapter (non-zero B) of the tiny Llama the ``tiny_llama`` fixture has (2 layers, hidden 64)."""
    return make_peft_adapter(tiny_llama_model(), out, r=r, modules=targets, seed=seed, alpha=alpha, rslora=rslora)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory) -> Path:
    return make_adapter(tmp_path_factory.mktemp("adapter") / "a")


def expected_rows(folder: Path) -> dict:
    """(module_id, layer) -> (rank, float32 row) from the recorded rules, independently of builders.lora_trtllm."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "adapter_config.json").read_text())
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r  # lora.json hf_lora_convert.scaling
    to_trt = {hf: trt for trt, hf in LORA["lora_manager"]["default_trtllm_modules_to_hf_modules"].items()
              if trt != "from"}
    ids = LORA["lora_manager"]["LORA_MODULE_IDS"]
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    rows = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        parts = key.split(".")
        layer, module = int(parts[parts.index("layers") + 1]), parts[-3]
        row = np.concatenate([a.float().numpy().reshape(-1), (b.float().numpy() * scale).reshape(-1)])
        rows[(ids[to_trt[module]], layer)] = (r, row)
    return rows


def read(folder: Path, name="a", task_id=1):
    adapter, problems = read_adapter(name, folder, task_id, "lora.adapters.a")
    assert not problems
    return adapter


# --- constants against the facts ----------------------------------------------------------------------------------

def test_module_ids_and_hf_map_are_upstreams():
    assert lt.LORA_MODULE_IDS == LORA["lora_manager"]["LORA_MODULE_IDS"]
    default = {k: v for k, v in LORA["lora_manager"]["default_trtllm_modules_to_hf_modules"].items() if k != "from"}
    assert HF_TO_TRTLLM == {hf: trt for trt, hf in default.items() if hf in HF_TO_TRTLLM}
    assert set(HF_TO_TRTLLM) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    # the converter's own map agrees for every module served
    conv = LORA["hf_lora_convert"]["hf_modules_to_trtllm_modules"]
    assert all(conv[hf] == trt for hf, trt in HF_TO_TRTLLM.items())


def test_build_flags_are_ones_trtllm_build_accepts():
    class Lora:
        trtllm_modules, max_lora_rank = ["attn_q", "attn_v", "mlp_4h_to_h"], 16

    argv = lt.build_flags(Lora, "float16")
    flags = {**BUILD["flags"], **BUILD["plugin_flags"]}
    assert argv[0] == "--lora_plugin" and argv[1] in flags["--lora_plugin"]["choices"]
    i = argv.index("--lora_target_modules")
    mods = argv[i + 1:argv.index("--max_lora_rank")]
    assert set(mods) <= set(flags["--lora_target_modules"]["choices"])
    assert mods == ["attn_q", "attn_k", "attn_v", "mlp_4h_to_h"]  # upstream adds the missing qkv module
    assert argv[-2:] == ["--max_lora_rank", "16"] and flags["--max_lora_rank"]["type"] == "int"
    assert lt.build_flags(None, "float16") == []


def test_written_dtypes_are_ones_the_cpp_reader_reads():
    accepted = LORA["cpp_runtime"]["npy_reader"]["descr_accepted"]
    assert all(d.str.lstrip("<>=|") in accepted for d in lt.NPY_DTYPES.values())
    assert "bfloat16" not in lt.NPY_DTYPES


# --- conversion -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rslora", [False, True])
def test_conversion_equals_the_recorded_layout(tmp_path, rslora):
    folder = make_adapter(tmp_path / "a", rslora=rslora, r=4, alpha=8)
    conv = lt.convert_adapter(read(folder), "float16")
    want = expected_rows(folder)
    rows = len(want)
    assert rows == 2 * 3  # 2 layers x (q, v, down)
    width = max(len(row) for _, row in want.values())
    assert conv.weights.shape == (1, rows, width) and conv.weights.dtype == np.dtype("<f2")
    assert conv.config.shape == (1, rows, 3) and conv.config.dtype == np.int32
    for i, (module_id, layer, rank) in enumerate(conv.config[0].tolist()):
        r, row = want.pop((module_id, layer))
        assert rank == r
        got = conv.weights[0, i]
        np.testing.assert_array_equal(got[:row.size], row.astype(np.float16))
        assert not got[row.size:].any()  # zero padding at the end
    assert not want


def test_bfloat16_is_refused_clearly(adapter_dir):
    with pytest.raises(lt.LoraConversionError, match="bfloat16.*float16"):
        lt.convert_adapter(read(adapter_dir), "bfloat16")


def test_plan_bytes_equal_the_converted_tensors(adapter_dir):
    adapter = read(adapter_dir)
    conv = lt.convert_adapter(adapter, "float16")
    assert sum(conv.row_sizes) * conv.weights.itemsize == adapter_bytes(adapter, 2)


def test_prefetch_dir_layout(tmp_path, adapter_dir):
    other = make_adapter(tmp_path / "b", targets=("o_proj",), r=2, seed=2)
    facts = lt.write_prefetch_dir([read(adapter_dir), read(other, "b", 2)], tmp_path / "lora", "float16")
    assert sorted(p.name for p in (tmp_path / "lora").iterdir()) == ["1", "2"] == sorted(facts)
    for task in ("1", "2"):
        files = sorted(p.name for p in (tmp_path / "lora" / task).iterdir())
        assert files == sorted([LORA["hf_lora_convert"]["files"]["weights"], LORA["hf_lora_convert"]["files"]["config"]])
        with open(tmp_path / "lora" / task / "model.lora_weights.npy", "rb") as fh:
            version = np.lib.format.read_magic(fh)
            header = np.lib.format._read_array_header(fh, version)
        assert version[0] in LORA["cpp_runtime"]["npy_reader"]["npy_versions"]
        assert header[1] is False and header[2].str == "<f2"  # fortran_order False, descr f2
    cfg = np.load(tmp_path / "lora" / "2" / "model.lora_config.npy")
    assert cfg[0, :, 0].tolist() == [lt.LORA_MODULE_IDS["attn_dense"]] * 2 and cfg[0, :, 2].tolist() == [2, 2]


def test_digest_follows_content_not_path(tmp_path, adapter_dir):
    copy = tmp_path / "copy"
    shutil.copytree(adapter_dir, copy)
    d0 = adapters_digest([read(adapter_dir)])
    assert adapters_digest([read(copy)]) == d0
    make_adapter(copy, seed=7)  # same shapes, other weights
    assert adapters_digest([read(copy)]) != d0


# --- plan, argv, repository, bundle --------------------------------------------------------------------------------

def _build(tmp_path, tiny_llama, adapter, *, dtype="float16", quant="none"):
    spec = write_spec(tmp_path / "b.yaml", tiny_llama, target="h100", quant=quant, extra=(
        f"    lora: {{adapters: {{support: {adapter}}}, max_loras: 2, max_cpu_loras: 4}}\n"))
    if dtype != "float16":
        spec.write_text(spec.read_text().replace("dtype: float16", f"dtype: {dtype}"))
    build = load_spec(spec, "h100")
    hf = json.loads((tiny_llama / "config.json").read_text())
    return build, get_target("h100"), hf


def test_trtllm_bfloat16_build_with_adapters_is_refused(tmp_path, tiny_llama, adapter_dir):
    build, _, hf = _build(tmp_path, tiny_llama, adapter_dir, dtype="bfloat16")
    assert "lora_dtype" in [p.code for p in lora_problems(build, hf)]


def test_plan_holds_qkv_together(tmp_path, tiny_llama, adapter_dir):
    build, target, hf = _build(tmp_path, tiny_llama, adapter_dir)
    plan = make_plan(build, target, hf)
    assert plan.lora.target_modules == ["down_proj", "q_proj", "v_proj"]
    assert sorted(plan.lora.trtllm_modules) == ["attn_k", "attn_q", "attn_v", "mlp_4h_to_h"]


def test_argv_has_lora_flags_and_the_double_accepts_them(tmp_path, tiny_llama, adapter_dir):
    build, target, hf = _build(tmp_path, tiny_llama, adapter_dir)
    plan = make_plan(build, target, hf)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"dtype": "float16", "mapping": {"world_size": 1}}))
    out = tmp_path / "engine"
    out.mkdir()
    argv = trtllm_build_argv(checkpoint_dir=ckpt, output_dir=out, limits=plan.limits, plugins=plan.plugins,
                             world_size=1, gpus_available=1, executable=[str(DOUBLE)], lora=plan.lora,
                             dtype=plan.dtype)
    i = argv.index("--lora_plugin")
    assert argv[i + 1] == "float16"
    j = argv.index("--lora_target_modules")
    assert argv[j + 1:argv.index("--max_lora_rank")] == ["attn_q", "attn_k", "attn_v", "mlp_4h_to_h"]
    assert argv[argv.index("--max_lora_rank") + 1] == "4"
    run_trtllm_build(argv, out / "trtllm-build.log", progress=False)


def _params(config) -> dict:
    return {k: v.string_value for k, v in config.parameters.items()}


def test_repository_lora_cache_parameters(tmp_path, tiny_llama, adapter_dir):
    from model_repo.generate import plan_repository, write_repository

    build, target, hf = _build(tmp_path, tiny_llama, adapter_dir)
    plan = make_plan(build, target, hf)
    repo = plan_repository(build, target, plan, tmp_path / "engine", engine_built=False, tokenizer_dir=tiny_llama,
                           sys_path=[])
    params = _params(write_repository(repo, tmp_path / "repo")["tensorrt_llm"])
    assert params["lora_prefetch_dir"] == str(tmp_path / "engine" / "lora")
    assert params["lora_cache_max_adapter_size"] == params["lora_cache_optimal_adapter_size"] == "4"
    assert int(params["lora_cache_host_memory_bytes"]) == plan.lora.host_cache_bytes
    frac = float(params["lora_cache_gpu_memory_fraction"])
    m = plan.memory
    left = m.device_bytes - m.total_bytes + plan.lora.gpu_cache_bytes
    assert plan.lora.gpu_cache_bytes <= frac * left < plan.lora.gpu_cache_bytes + 1e-4 * left
    for key in ("lora_prefetch_dir", "lora_cache_max_adapter_size", "lora_cache_optimal_adapter_size",
                "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes"):
        assert key in BACKEND
    # without adapters no LoRA key is written (a present lora_prefetch_dir is passed on even when empty)
    spec = write_spec(tmp_path / "plain.yaml", tiny_llama)
    plain = load_spec(spec, "h100")
    repo = plan_repository(plain, target, make_plan(plain, target, hf), tmp_path / "engine2", engine_built=False,
                           tokenizer_dir=tiny_llama, sys_path=[])
    assert not [k for k in _params(write_repository(repo, tmp_path / "repo2")["tensorrt_llm"]) if "lora" in k]


def test_bundle_carries_the_prefetch_folder(tmp_path, tiny_llama, adapter_dir):
    from model_repo.bundle import SCRIPT_NAME, write_bundle

    build, target, hf = _build(tmp_path, tiny_llama, adapter_dir)
    plan = make_plan(build, target, hf)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    tmp, final = tmp_path / "bundle.tmp", tmp_path / "bundle"
    tmp.mkdir()
    facts = write_bundle(tmp, final, build=build, target=target, plan=plan, ckpt_dir=ckpt, hf_dir=tiny_llama,
                         stage_keys={})
    assert facts["lora_prefetch"]["1"]["name"] == "support"
    np.testing.assert_array_equal(np.load(tmp / "lora" / "1" / "model.lora_weights.npy"),
                                  lt.convert_adapter(read(adapter_dir), "float16").weights)
    script = (tmp / SCRIPT_NAME).read_text()
    assert 'cp -r "$BUNDLE_DIR/lora" "$BUNDLE_DIR/engine/lora"' in script
    assert "--lora_plugin float16" in script and "--max_lora_rank 4" in script
    subprocess.run(["bash", "-n", str(tmp / SCRIPT_NAME)], check=True)
    params = _params(write_repository_configs(tmp / "model_repo"))
    assert params["lora_prefetch_dir"] == str(final.resolve() / "engine" / "lora")


def write_repository_configs(repo: Path):
    from model_repo.generate import parse_config

    path = repo / "tensorrt_llm" / "config.pbtxt"
    return parse_config(path.read_text(), str(path))


def test_gpu_fraction_covers_the_cache_in_what_the_kv_pool_leaves():
    """The backend takes fraction x the memory free after the engine and the KV pool (lora.json cpp_runtime.cache):
    80 GiB device, 70 GiB planned in all including a 2 GiB LoRA cache -> 12 GiB free then, 2/12 of it."""
    from types import SimpleNamespace

    gib = 2**30
    lora = SimpleNamespace(max_lora_rank=16, max_loras=4, max_cpu_loras=8, gpu_cache_bytes=2 * gib,
                           host_cache_bytes=4 * gib)
    memory = SimpleNamespace(device_bytes=80 * gib, total_bytes=70 * gib)
    params = lt.cache_parameters(lora, memory)
    assert params["lora_cache_gpu_memory_fraction"][0] == "0.1667"
    assert params["lora_cache_host_memory_bytes"][0] == str(4 * gib)
    assert params["lora_cache_max_adapter_size"][0] == params["lora_cache_optimal_adapter_size"][0] == "16"
    memory = SimpleNamespace(device_bytes=80 * gib, total_bytes=90 * gib)  # over-committed plan: all of it
    assert lt.cache_parameters(lora, memory)["lora_cache_gpu_memory_fraction"][0] == "1.0000"
