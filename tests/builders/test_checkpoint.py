"""Reading TensorRT-LLM checkpoints back: INT4 unpacking against ModelOpt's packer, and an
unquantized ModelOpt export that round-trips bit-exactly into HF layout (both marked slow: they
import ModelOpt, which calibrates nothing here but costs seconds; the nibble layout is also pinned
without it)."""

from __future__ import annotations

import pytest
import torch

from builders.checkpoint import dequantize_linear, to_hf_state_dict, unpack_int4
from tests.conftest import tiny_llama_model


def test_unpack_int4_reads_the_low_nibble_as_the_even_row():
    """ModelOpt's layout (pack_int4_in_uint8): byte [j, i] holds row 2j low, row 2j+1 high, two's complement."""
    packed = torch.tensor([[0x21, 0x8F], [0x7E, 0x08]], dtype=torch.uint8).view(torch.int8)
    assert unpack_int4(packed).tolist() == [[1, -1], [2, -8], [-2, -8], [7, 0]]


@pytest.mark.slow  # imports ModelOpt's packer
def test_unpack_int4_inverts_modelopt_packing():
    from modelopt.torch.export.quant_utils import pack_int4_in_uint8

    g = torch.Generator().manual_seed(0)
    out_dim, in_dim, group = 8, 64, 32
    q = torch.randint(-8, 8, (out_dim, in_dim), generator=g).float()
    scale = torch.rand(out_dim, in_dim // group, generator=g) + 0.5
    weight = q * scale.repeat_interleave(group, dim=1)
    packed = pack_int4_in_uint8(weight, scale, group)
    assert packed.shape == (out_dim // 2, in_dim)
    assert torch.equal(unpack_int4(packed).float(), q)
    deq = dequantize_linear({"l.weight": packed.view(torch.int8), "l.weights_scaling_factor": scale}, "l",
                            "W4A16_AWQ", group)
    assert torch.allclose(deq, weight)


def test_prequant_scale_is_folded_into_the_weight():
    w = torch.randn(4, 6, dtype=torch.float16)
    pqs = torch.rand(6, dtype=torch.float16) + 0.5
    deq = dequantize_linear({"l.weight": w, "l.prequant_scaling_factor": pqs}, "l", None, 128)
    x = torch.randn(3, 6)
    assert torch.allclose(x @ deq.T, (x * pqs.float()) @ w.float().T, atol=1e-5)


@pytest.mark.slow  # ModelOpt's TensorRT-LLM checkpoint export
def test_unquantized_export_round_trips_bit_exactly(tmp_path):
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    model = tiny_llama_model(vocab=256, max_positions=128, tie=False).to(torch.float16)
    export_tensorrt_llm_checkpoint(model, "llama", torch.float16, str(tmp_path / "ckpt"),
                                   inference_tensor_parallel=1, inference_pipeline_parallel=1)
    sd, info = to_hf_state_dict(tmp_path / "ckpt")
    src = model.state_dict()
    assert set(sd) == set(src)
    for k, v in src.items():
        assert torch.equal(sd[k].to(torch.float16), v), k
