"""Calibration batches: one forward pass over several windows gives ModelOpt the scales one pass per window
gives, in fewer passes (builders.quantize.calibration_batches)."""

from __future__ import annotations

import random

import pytest

from builders.quantize import calibration_batches, quantize_model
from tests.conftest import tiny_llama_model


def test_batches_keep_order_and_equal_lengths_under_the_token_budget():
    a, b, c = [1] * 4, [2] * 4, [3] * 6
    assert calibration_batches([a, b, a, b, a], max_tokens=8) == [[a, b], [a, b], [a]]
    assert calibration_batches([a, c, b], max_tokens=64) == [[a], [c], [b]]  # no padding across lengths
    assert calibration_batches([c], max_tokens=4) == [[c]]  # a window longer than the budget goes alone
    assert calibration_batches([], max_tokens=8) == []


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if "quantizer" in k or k.endswith(".weight")}


@pytest.mark.slow  # ModelOpt calibration of a tiny model, twice per recipe
@pytest.mark.parametrize("quant_algo", ["int4_awq", "fp8", "int4_gptq"])
def test_one_pass_over_a_batch_gives_the_scales_of_one_pass_per_window(quant_algo, monkeypatch):
    import torch

    import builders.quantize as q

    rng = random.Random(0)
    samples = [[rng.randrange(49152) for _ in range(32)] for _ in range(6)]
    states, calls = {}, {}
    for budget in (32, 192):  # one window per pass; all six in one pass
        monkeypatch.setattr(q, "CALIBRATION_BATCH_TOKENS", budget)
        model = tiny_llama_model(hidden=64, intermediate=128)
        seen = []
        model.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(
            (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[0]), with_kwargs=True)
        quantize_model(model, quant_algo=quant_algo, group_size=64, kv_cache_quant_algo=None, calib_samples=samples)
        states[budget], calls[budget] = _state(model), seen
    assert sum(calls[32]) == sum(calls[192]) and set(calls[32]) == {1}  # every window seen in each pass
    assert max(calls[192]) == 6 and len(calls[192]) < len(calls[32])
    one, batched = states[32], states[192]
    assert one.keys() == batched.keys() and any("quantizer" in k for k in one)
    for k in one:
        torch.testing.assert_close(batched[k], one[k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
