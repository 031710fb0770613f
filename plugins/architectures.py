"""Model architectures: the registry of Hugging Face ``architectures[0]`` names the pipeline builds.

Each :class:`Architecture` owns what the rules, the planner and the stages need to know about
one family: the ModelOpt export decoder type, the checkpoint layout our reader merges back, the
linear layers of one decoder layer (for the memory plan and the AWQ group rule) and which
TensorRT-LLM fusions apply. Rules ask these traits; adding a family is adding one entry to
:data:`ARCHITECTURES` (and, for a new layout, its reader in ``builders/checkpoint.py``).

Sources: ModelOpt 0.47 ``modelopt/torch/export/model_config_utils.py`` / ``layer_utils.py``
(decoder types), TensorRT-LLM 1.2 ``tensorrt_llm/models/llama/model.py`` (the Llama layout:
fused QKV and gate/up column-parallel, o_proj and down_proj row-parallel, RMSNorm) and
``tensorrt_llm/commands/build.py`` (``reduce_fusion`` for Llama-family models with tp > 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LinearShard:
    """One linear layer of a decoder layer as a rank holds it: ``n_in x n_out`` after tensor parallelism."""

    name: str
    n_in: int
    n_out: int
    row_parallel: bool
    """Split on its input dim across tp ranks (o_proj, down_proj); column-parallel ones keep their input."""


@dataclass(frozen=True)
class Architecture:
    """One model family.

    Attributes:
        name: the HF ``config.json`` ``architectures[0]`` value.
        decoder_type: ModelOpt's ``export_tensorrt_llm_checkpoint`` decoder type.
        layout: the checkpoint layout ``builders.checkpoint`` reads back (``llama``: q/k/v/o, gate/up/down,
            RMSNorm).
        reduce_fusion: TensorRT-LLM fuses the all-reduce with the residual add and RMSNorm under tp > 1.
    """

    name: str
    decoder_type: str
    layout: str
    reduce_fusion: bool

    def linear_shards(self, *, hidden_size: int, heads_rank: int, kv_heads_rank: int, head_dim: int,
                      intermediate_rank: int) -> list[LinearShard]:
        """The linear layers of one decoder layer on one rank (the Llama layout: qkv, o, gate, up, down)."""
        h = hidden_size
        return [LinearShard("qkv", h, (heads_rank + 2 * kv_heads_rank) * head_dim, False),
                LinearShard("o_proj", heads_rank * head_dim, h, True),
                LinearShard("gate_proj", h, intermediate_rank, False),
                LinearShard("up_proj", h, intermediate_rank, False),
                LinearShard("down_proj", intermediate_rank, h, True)]


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("LlamaForCausalLM", decoder_type="llama", layout="llama", reduce_fusion=True),
    Architecture("MistralForCausalLM", decoder_type="llama", layout="llama", reduce_fusion=True),
)}
"""Every architecture the pipeline exports and reads back, by HF name."""

DEFAULT_ARCHITECTURE = "LlamaForCausalLM"
"""Assumed when a config.json names no architecture."""


def architecture(name: Optional[str]) -> Optional[Architecture]:
    """The entry for HF architecture ``name`` (None when the pipeline does not support it)."""
    return ARCHITECTURES.get(name or DEFAULT_ARCHITECTURE)
