"""Tiny random checkpoints of every family in plugins.architectures, built with transformers' own config classes.

2 layers, hidden 64, 4 heads / 2 KV heads (head_dim 16, or 32 where the family sets head_dim), SmolLM2's real
vocabulary (49152 ids, bos 1, eos 2), seeded weights with ``initializer_range`` 0.2 so that greedy logits are
not near-ties (the default 0.02 makes argmax flip between attention kernels). MoE families get 4 experts, top-2
(Qwen2-MoE also a shared expert). Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

VOCAB = 49152
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, bos_token_id=1,
              eos_token_id=2, pad_token_id=2)

FAMILIES = {  # HF architecture -> (config class, extra config fields)
    "LlamaForCausalLM": ("LlamaConfig", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128})),
    "MistralForCausalLM": ("MistralConfig", dict(sliding_window=None)),
    "Qwen2ForCausalLM": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "Qwen3ForCausalLM": ("Qwen3Config", dict(head_dim=32)),
    "Gemma2ForCausalLM": ("Gemma2Config", dict(head_dim=32, sliding_window=16, query_pre_attn_scalar=32)),
    # untied: a tiny random Gemma 3 with tied, sqrt(hidden)-scaled embeddings only repeats its last prompt token
    "Gemma3ForCausalLM": ("Gemma3TextConfig", dict(head_dim=32, sliding_window=16, query_pre_attn_scalar=32,
                                                   tie_word_embeddings=False)),
    "Phi3ForCausalLM": ("Phi3Config", dict()),
    "MixtralForCausalLM": ("MixtralConfig", dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)),
    "Qwen3MoeForCausalLM": ("Qwen3MoeConfig", dict(head_dim=32, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[])),
    "Qwen2MoeForCausalLM": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=64)),
}
SHORT = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
         "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
         "Phi3ForCausalLM": "phi3", "MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3moe",
         "Qwen2MoeForCausalLM": "qwen2moe"}


def tiny_model(arch: str, seed: int = 0, **overrides):
    """A random ``arch`` model in eval mode, float32, ``config.architectures`` set (as from_pretrained sets it)."""
    import torch
    import transformers

    cfg_name, extra = FAMILIES[arch]
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **extra, **overrides})
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    return getattr(transformers, arch)(cfg).eval()


def save_tiny(arch: str, out: Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny ``arch`` checkpoint with SmolLM2's tokenizer files into ``out``; returns ``out``."""
    from tests.conftest import smollm2_tokenizer_dir

    tiny_model(arch, seed, **overrides).save_pretrained(str(out))
    src = smollm2_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    return out


def fake_quant_weights(model) -> dict:
    """ModelOpt's simulated weights of every quantized nn.Linear: weight_quantizer(weight) x pre-quant scale
    (float32 tensors by ``<module>.weight``)."""
    import torch

    out = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            wq = getattr(mod, "weight_quantizer", None)
            if wq is None or not getattr(wq, "is_enabled", False) or not isinstance(mod, torch.nn.Linear):
                continue
            try:
                w = wq(mod.weight.float())
            except AssertionError:  # NVFP4's fake quantization needs CUDA: ModelOpt's own NVFP4 round trip instead
                w = _nvfp4_round_trip(mod.weight.float())
            pqs = getattr(mod.input_quantizer, "_pre_quant_scale", None)
            out[f"{name}.weight"] = w if pqs is None else w * pqs.float().reshape(1, -1)
    return out


def _nvfp4_round_trip(w):
    """ModelOpt's NVFP4QTensor quantize + dequantize of ``w`` (blocks of 16 inputs; runs on CPU)."""
    import torch
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    q, scale, scale_2 = NVFP4QTensor.quantize(w, 16)
    return q.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
