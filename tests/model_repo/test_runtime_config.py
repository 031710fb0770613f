"""The portable runtime's settings (model_repo/runtime_config.py), the attention-kernel switches they set,
and the CUDA check of the manager the served model, its engine worker and the in-process bench all build
(tensorrt_llm_pytorch/1/engine_worker.build_manager), on a tiny random Llama, no server."""

from __future__ import annotations

import pytest

from tests.templates import template_module
from trtpipe_runtime.runtime_config import SDPA_BACKENDS, apply_sdpa_backends, runtime_settings

BUILD = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256, "tokens_per_block": 16}
KV = {"max_tokens_in_paged_kv_cache": "512"}  # the generator always writes it (plugins.runtimes.kv_slots)


@pytest.mark.parametrize("value, expected", [("", None), ("auto", None), ("math", ["math"]),
                                             (" flash, mem_efficient ", ["flash", "mem_efficient"])])
def test_sdpa_backends_setting(value, expected):
    assert runtime_settings({**KV, "sdpa_backends": value}, BUILD)["sdpa_backends"] == expected


def test_unknown_sdpa_backend_names_the_value_and_the_choices():
    with pytest.raises(ValueError) as err:
        runtime_settings({**KV, "sdpa_backends": "flash,fa3"}, BUILD)
    assert "fa3" in str(err.value) and all(name in str(err.value) for name in SDPA_BACKENDS)


@pytest.fixture
def restore_sdpa_flags():
    import torch

    before = {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in SDPA_BACKENDS}
    yield
    for name, on in before.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


def test_sdpa_backends_set_exactly_the_chosen_torch_flags(restore_sdpa_flags):
    """The process-wide switches follow the setting (None leaves them), and the report reads them back."""
    import torch

    assert apply_sdpa_backends({"sdpa_backends": ["math"]}) == ["math"]
    assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    assert apply_sdpa_backends({"sdpa_backends": None}) == ["math"]
    assert apply_sdpa_backends({"sdpa_backends": ["flash", "cudnn"]}) == ["flash", "cudnn"]
    assert not torch.backends.cuda.math_sdp_enabled()


def test_cuda_without_a_gpu_is_refused_where_the_model_loads(tiny_llama):
    """The check runs in build_manager, so it holds in the stub and in the engine worker alike."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    engine = template_module("tensorrt_llm_pytorch", "engine_worker")
    with pytest.raises(RuntimeError, match="sees no GPU in the process that runs the generation loop"):
        engine.build_manager(str(tiny_llama), runtime_settings(dict(KV), BUILD), "cuda", "float32")


def test_kv_slots_are_the_repositorys_and_required():
    assert runtime_settings(dict(KV), BUILD)["num_blocks"] == 512 // 16
    with pytest.raises(ValueError, match="max_tokens_in_paged_kv_cache is missing"):
        runtime_settings({}, BUILD)


@pytest.fixture
def tiny_engine(tiny_llama, tmp_path):
    """tiny_llama as an engine folder of the portable runtime (its engine.json names the attention)."""
    import json
    import shutil

    out = tmp_path / "engine"
    shutil.copytree(tiny_llama, out)
    (out / "engine.json").write_text(json.dumps({"attn_implementation": "sdpa"}))
    return out


def test_a_loop_that_dies_at_start_fails_the_load_with_its_error(tiny_engine):
    """A KV pool larger than the device's memory kills transformers' generation loop at its start (session 8 on an
    H100); the model then reported READY and dropped every request as 'stopping or queue full'. await_loop raises
    with the loop's own error, so the stub (or the engine worker) fails the model's load instead."""
    engine = template_module("tensorrt_llm_pytorch", "engine_worker")
    huge = {"max_tokens_in_paged_kv_cache": str(16 * 10**12)}  # 10^12 blocks of 16 tokens: no machine has that
    manager, _, _ = engine.build_manager(str(tiny_engine), runtime_settings(huge, BUILD), "cpu", "float32")
    manager.start()
    try:
        with pytest.raises(RuntimeError, match=r"the generation loop died: MemoryError: .*--target"):
            engine.await_loop(manager, timeout_s=120)
        assert engine.loop_failure(manager).startswith("the generation loop died: MemoryError")
    finally:
        manager.stop(block=True, timeout=10)


def test_a_loop_that_starts_passes_the_wait(tiny_engine):
    engine = template_module("tensorrt_llm_pytorch", "engine_worker")
    manager, _, _ = engine.build_manager(str(tiny_engine), runtime_settings(dict(KV), BUILD), "cpu", "float32")
    manager.start()
    try:
        engine.await_loop(manager, timeout_s=120)
        assert manager.batch_processor is not None and engine.loop_failure(manager) is None
    finally:
        manager.stop(block=True, timeout=10)
    assert engine.loop_failure(manager) is None  # a stopped loop is not a dead one
