"""Reading TensorRT-LLM checkpoints back: INT4 unpacking against ModelOpt's packer, and an
unquantized ModelOpt export that round-trips bit-exactly into HF layout."""

from __future__ import annotations

import torch

from builders.checkpoint import dequantize_linear, to_hf_state_dict, unpack_int4


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


def _tiny_llama(tmp_path, heads=4, kv_heads=2, layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float16)
    return model


def test_unquantized_export_round_trips_bit_exactly(tmp_path):
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    model = _tiny_llama(tmp_path)
    export_tensorrt_llm_checkpoint(model, "llama", torch.float16, str(tmp_path / "ckpt"),
                                   inference_tensor_parallel=1, inference_pipeline_parallel=1)
    sd, info = to_hf_state_dict(tmp_path / "ckpt")
    src = model.state_dict()
    assert set(sd) == set(src)
    for k, v in src.items():
        assert torch.equal(sd[k].to(torch.float16), v), k
