"""The portable runtime's settings (model_repo/runtime_config.py) and the manager the served model, its
engine worker and the in-process bench all build (tensorrt_llm_pytorch/1/engine_worker.build_manager):
a real transformers ContinuousBatchingManager with a tiny random Llama, no server."""

from __future__ import annotations

import pytest

from model_repo.generate import load_template_module
from model_repo.runtime_config import SDPA_BACKENDS, runtime_settings

BUILD = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256, "tokens_per_block": 16}
PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1789, 30]


@pytest.mark.parametrize("value, expected", [("", None), ("auto", None), ("math", ["math"]),
                                             (" flash, mem_efficient ", ["flash", "mem_efficient"])])
def test_sdpa_backends_setting(value, expected):
    assert runtime_settings({"sdpa_backends": value}, BUILD)["sdpa_backends"] == expected


def test_default_attention_kernels_are_all_but_cudnn():
    """The repository's default (plan.PORTABLE_RUNTIME_CHOICES, written into config.pbtxt) keeps torch from
    cuDNN attention, whose per-shape plans made first visits of a batch shape slow on the H200."""
    from plugins.runtimes import PORTABLE_RUNTIME_CHOICES

    params = {name: value for name, value, _ in PORTABLE_RUNTIME_CHOICES}
    assert sorted(runtime_settings(params, BUILD)["sdpa_backends"]) == sorted(set(SDPA_BACKENDS) - {"cudnn"})


def test_unknown_sdpa_backend_names_the_value_and_the_choices():
    with pytest.raises(ValueError) as err:
        runtime_settings({"sdpa_backends": "flash,fa3"}, BUILD)
    assert "fa3" in str(err.value) and all(name in str(err.value) for name in SDPA_BACKENDS)


@pytest.fixture
def restore_sdpa_flags():
    import torch

    before = {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in SDPA_BACKENDS}
    yield
    for name, on in before.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


def _greedy(engine, settings, n=8):
    manager, _, info = engine.build_manager(settings["dir"], settings, "cpu", "float32")
    manager.start()
    try:
        manager.add_request(PROMPT, request_id="r", max_new_tokens=n, eos_token_id=[10**6])
        while True:
            res = manager.get_result(request_id="r", timeout=60)
            assert res is not None, "no result within 60 s"
            if res.is_finished():
                return list(res.generated_tokens), info
    finally:
        manager.stop(block=True)


def test_restricted_attention_kernels_give_the_same_tokens(tiny_llama, restore_sdpa_flags):
    """sdpa_backends = math: torch may use only the math kernel in this process (what the log reports),
    and greedy decoding gives the tokens of torch's own choice."""
    import torch

    engine = load_template_module("tensorrt_llm_pytorch/1/engine_worker.py", "trtpipe_engine_worker_test")
    base = dict(runtime_settings({}, BUILD), dir=str(tiny_llama))
    tokens, info = _greedy(engine, base)
    assert len(tokens) == 8 and info["sdpa_backends"] == [n for n in SDPA_BACKENDS
                                                          if getattr(torch.backends.cuda, f"{n}_sdp_enabled")()]
    math_only, info = _greedy(engine, dict(runtime_settings({"sdpa_backends": "math"}, BUILD), dir=str(tiny_llama)))
    assert info["sdpa_backends"] == ["math"] and not torch.backends.cuda.flash_sdp_enabled()
    assert math_only == tokens


def test_cuda_without_a_gpu_is_refused_where_the_model_loads(tiny_llama):
    """The check runs in build_manager, so it holds in the stub and in the engine worker alike."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    engine = load_template_module("tensorrt_llm_pytorch/1/engine_worker.py", "trtpipe_engine_worker_test")
    with pytest.raises(RuntimeError, match="sees no GPU in the process that runs the generation loop"):
        engine.build_manager(str(tiny_llama), runtime_settings({}, BUILD), "cuda", "float32")
