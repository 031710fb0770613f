"""The dimensions of a model that the plan needs, read from its Hugging Face ``config.json`` (no weights):
:class:`ModelShape`, and the longest context its rope scaling supports (:func:`rope_context`).

Sources: the HF config classes of each family (transformers 5.24 ``models/<family>/configuration_*.py``) and
transformers' ``modeling_rope_utils.py`` (rope_scaling / rope_parameters and their types).
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from plugins.architectures import DEFAULT_ARCHITECTURE, ROPE_ALIASES, architecture
from plugins.errors import Problem, SpecError


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _rope_entries(cfg: dict) -> list[dict]:
    """The rope dicts config.json holds (``rope_scaling`` / ``rope_parameters``, one per layer type or one)."""
    out = []
    for value in (cfg.get("rope_scaling"), cfg.get("rope_parameters")):
        if isinstance(value, dict):
            out += [v for v in value.values() if isinstance(v, dict)] or [value]
    return out


def _rope_types(cfg: dict) -> list[str]:
    """Every rope type config.json names: transformers 4's ``rope_scaling`` or transformers 5's
    ``rope_parameters`` (one dict, or one per layer type as Gemma 3 writes it); ``default`` when none."""
    found = [str(entry.get("rope_type", entry.get("type", "default"))) for entry in _rope_entries(cfg)]
    return sorted({ROPE_ALIASES.get(t, t) for t in found}) or ["default"]


def rope_context(cfg: dict) -> Optional[tuple[int, str]]:
    """The longest context config.json's rope scaling extends the model to, and how it was computed; None when
    the config has no scaled rope entry (or one this cannot size).

    transformers 5.24 ``modeling_rope_utils.py``: ``linear`` divides the frequencies by ``factor`` and ``dynamic``
    (NTK) rescales the base past ``max_position_embeddings`` (the pretrained length) by ``factor``; ``yarn``'s
    ``factor`` is "the ratio between the pre-yarn and post-yarn context lengths" over
    ``original_max_position_embeddings`` (a top-level ``original_max_position_embeddings`` takes priority, as
    ``standardize_rope_params`` does; a missing ``factor`` is max_position_embeddings / that); for ``llama3`` and
    ``longrope`` ``max_position_embeddings`` is already the extended length (Llama 3.1: 131072 = 8192 x 16 with
    factor 8; Phi-3-128k: 131072 over original 4096). With one entry per layer type (Gemma 3), the tightest
    scaled entry decides."""
    mpe = cfg.get("max_position_embeddings")
    top_original = cfg.get("original_max_position_embeddings")
    found: list[tuple[int, str]] = []
    for entry in _rope_entries(cfg):
        t = str(entry.get("rope_type", entry.get("type", "default")))
        t = ROPE_ALIASES.get(t, t)
        factor = entry.get("factor")
        factor = float(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else None
        original = top_original or entry.get("original_max_position_embeddings")
        if t in ("llama3", "longrope"):
            if mpe:
                found.append((int(mpe), f"rope {t}: max_position_embeddings {mpe} already holds the extension"))
            elif original and factor:
                found.append((int(original * factor), f"rope {t}: original_max_position_embeddings {original} x "
                                                      f"factor {factor:g}"))
        elif t == "yarn":
            base = original or mpe
            if base and factor:
                which = "original_max_position_embeddings" if original else "max_position_embeddings"
                found.append((int(base * factor), f"rope yarn: {which} {base} x factor {factor:g}"))
            elif mpe:
                found.append((int(mpe), f"rope yarn without a factor: max_position_embeddings {mpe}"))
        elif t in ("linear", "dynamic") and factor:
            base = entry.get("original_max_position_embeddings") or mpe
            if base:
                which = ("original_max_position_embeddings" if entry.get("original_max_position_embeddings")
                         else "max_position_embeddings")
                found.append((int(base * factor), f"rope {t}: {which} {base} x factor {factor:g}"))
    return min(found) if found else None


class ModelShape(_Frozen):
    """The dimensions of a decoder-only model that the plan needs (from HF config.json).

    Sources: the HF config classes of each family (transformers 5.24 ``models/<family>/configuration_*.py``:
    ``head_dim``, ``sliding_window``/``layer_types``, ``*_softcapping``, the MoE keys named in
    plugins.architectures.MoE, ``mlp_only_layers``/``decoder_sparse_step``).
    """

    architecture: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: Optional[int]
    rope_scaling_type: Optional[str]
    """``rope_scaling.rope_type`` when it is not ``default`` (long-context scaling), else null."""
    rope_types: list[str] = ["default"]
    """Every rope type the config names (Gemma 3 has one per layer type)."""
    tie_word_embeddings: bool
    sliding_window: Optional[int] = None
    """Tokens a sliding-window layer attends to (null: every layer attends to the whole context)."""
    sliding_layers: int = 0
    """Layers that use the sliding window (Gemma 2/3 interleave them with global layers)."""
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None
    num_experts: int = 0
    """Routed experts per MoE layer (0: dense)."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 0
    """Intermediate size of one expert."""
    shared_expert_intermediate_size: int = 0
    """Intermediate size of the shared expert every token runs (Qwen2-MoE; 0: none)."""
    moe_layers: int = 0
    """Decoder layers with experts; the others have a dense MLP of intermediate_size."""

    @classmethod
    def from_hf_config(cls, cfg: dict, field: str = "model.source") -> "ModelShape":
        """Read the shape from an HF ``config.json`` dict; raise SpecError naming missing keys."""
        required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
        missing = [k for k in required if not isinstance(cfg.get(k), int)]
        if missing:
            raise SpecError([Problem(field, cfg.get("_name_or_path"), f"the model's config.json lacks {missing}",
                                     "point model.source at a decoder-only HF checkpoint (`trtpipe families` lists them)",
                                     code="model_config")])
        heads = cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
        name = (cfg.get("architectures") or [DEFAULT_ARCHITECTURE])[0]
        types = _rope_types(cfg)
        scaled = [t for t in types if t != "default"]
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) is not False else None
        layer_types = cfg.get("layer_types")
        arch = architecture(name)
        # Which layers slide: config.json's layer_types, else the HF config class's own default pattern (Gemma 2
        # configs written before layer_types alternate: transformers fills in every 2nd layer as global).
        every = int(cfg.get("sliding_window_pattern") or (arch.global_every if arch else 0))
        if window and isinstance(layer_types, list):
            sliding = sum(1 for t in layer_types if t == "sliding_attention")
        elif window and every:  # every n-th layer is global
            sliding = sum(1 for i in range(layers) if (i + 1) % every)
        else:
            sliding = layers if window else 0
        moe: dict = {}
        experts = next((cfg[k] for k in arch.moe.num_experts_keys if cfg.get(k)), 0) if arch and arch.moe else 0
        if experts:
            m = arch.moe
            step = int(cfg.get(m.sparse_step_key) or 1) if m.sparse_step_key else 1
            dense = set(cfg.get("mlp_only_layers") or [])
            moe = {"num_experts": int(experts), "num_experts_per_tok": int(cfg.get(m.top_k_key) or 0),
                   "moe_intermediate_size": int(cfg.get(m.expert_intermediate_key) or 0),
                   "shared_expert_intermediate_size": int(cfg.get(m.shared_expert_key) or 0) if m.shared_expert_key
                   else 0,
                   "moe_layers": sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)}
        return cls(
            architecture=name, num_hidden_layers=layers, hidden_size=cfg["hidden_size"],
            num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
            vocab_size=cfg["vocab_size"], max_position_embeddings=cfg.get("max_position_embeddings"),
            rope_scaling_type=scaled[0] if scaled else None, rope_types=types,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", arch.tie_default if arch else False)),
            sliding_window=window or None, sliding_layers=sliding,
            attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
            final_logit_softcapping=cfg.get("final_logit_softcapping"), **moe)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0
