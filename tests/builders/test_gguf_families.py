"""Which model families transformers' GGUF loader round-trips, written the llama.cpp way.

``builders/model_fetch.py`` turns an embedded GGUF (SmolLM2, ``llama`` architecture) into an HF
checkpoint with ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``. This pins what that
loader does for the other families we might embed: for each, a tiny random model (2 layers, hidden
64, 4 heads, 2 KV heads, intermediate 128, vocab 32) is built from transformers' config classes,
written as an F32 GGUF with ``gguf.GGUFWriter`` under llama.cpp's naming and layout conventions,
loaded back with transformers, and every tensor is compared with ``torch.equal``. Families (or
spellings) that transformers refuses, or loads wrongly, are asserted as such, so a test fails
when upstream changes its mind.

Where the mappings come from (transformers 5.24, gguf 0.19, both in the venv):

* ``transformers/modeling_gguf_pytorch_utils.py``: ``GGUF_SUPPORTED_ARCHITECTURES`` (the keys of
  ``GGUF_CONFIG_MAPPING``), ``load_gguf_checkpoint`` (architecture renames: ``qwen2moe`` ->
  ``qwen2_moe``, ``qwen3moe`` -> ``qwen3_moe``, ``gemma3`` -> ``gemma3_text``; ``llama`` +
  ``general.name == "mistral"`` -> ``mistral``; ``tie_word_embeddings`` = no ``output.weight``),
  ``TENSOR_PROCESSORS`` (the inverse transforms: ``LlamaTensorProcessor._reverse_permute_weights``
  for ``attn_q``/``attn_k`` of the ``llama`` architecture, ``Gemma2TensorProcessor`` subtracting 1
  from every ``*norm.weight``, ``Qwen2MoeTensorProcessor`` merging ``ffn_gate_exps`` +
  ``ffn_up_exps`` into ``mlp.experts.gate_up_proj`` and reshaping ``ffn_gate_inp_shexp``) and
  ``get_gguf_hf_weights_map`` (HF <-> GGUF tensor names through gguf-py's table).
* ``transformers/integrations/ggml.py``: ``GGUF_CONFIG_MAPPING`` (GGUF metadata key -> config
  attribute, per architecture) and ``GGUF_CONFIG_DEFAULTS_MAPPING``.
* ``gguf/constants.py`` (``MODEL_ARCH_NAMES``, ``MODEL_TENSORS``) and ``gguf/tensor_mapping.py``
  (``TensorNameMap``, via ``gguf.get_tensor_name_map``): the tensor names this writer uses.
  The forward transforms mirror llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``,
  Gemma's ``norm + 1``, the split of fused expert tensors).

Known gaps pinned here: ``expert_feed_forward_length`` / ``expert_shared_feed_forward_length`` are
not mapped for ``qwen2moe``/``qwen3moe`` and ``attention.key_length`` not for ``qwen3``, so those
config values fall back to the config class defaults (``moe_intermediate_size`` 1408 / 768,
``shared_expert_intermediate_size`` 5632, ``head_dim`` 128) unless passed to ``from_pretrained``.
No tokenizer metadata is needed to load the model (only ``AutoTokenizer`` needs it); the
``tokenizer.ggml.*_token_id`` keys are written so the config's special ids fit the tiny vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES  # noqa: E402
from builders.model_fetch import load_gguf_model  # noqa: E402
from plugins.errors import StageError  # noqa: E402

COMMON = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=32, max_position_embeddings=128,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@dataclass(frozen=True)
class Family:
    config_cls: str                 # transformers config class
    arch: str                       # general.architecture as llama.cpp writes it
    loaded_cls: str                 # class from_pretrained(gguf_file=...) gives back
    config: dict = field(default_factory=dict)
    load_kwargs: dict = field(default_factory=dict)  # config values the GGUF loader drops
    name: str | None = None         # general.name


FAMILIES = {
    "llama": Family("LlamaConfig", "llama", "LlamaForCausalLM"),
    # SmolLM2 (the embedded model) ties its embeddings: no output.weight in the GGUF.
    "llama-tied": Family("LlamaConfig", "llama", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    # llama.cpp writes Mistral as `llama` with a name like this one; transformers keeps it a Llama
    # (same weights; the Mistral-only sliding_window is not carried).
    "mistral": Family("MistralConfig", "llama", "LlamaForCausalLM", name="Mistral-7B-Instruct-v0.3"),
    "qwen2": Family("Qwen2Config", "qwen2", "Qwen2ForCausalLM"),
    "qwen3": Family("Qwen3Config", "qwen3", "Qwen3ForCausalLM", {"head_dim": 16}, {"head_dim": 16}),
    "gemma2": Family("Gemma2Config", "gemma2", "Gemma2ForCausalLM",
                     {"head_dim": 16, "sliding_window": 64, "tie_word_embeddings": True}),
    "gemma3": Family("Gemma3TextConfig", "gemma3", "Gemma3ForCausalLM",
                     {"head_dim": 16, "sliding_window": 64, "tie_word_embeddings": True}),
    "phi3": Family("Phi3Config", "phi3", "Phi3ForCausalLM"),
    "qwen2moe": Family("Qwen2MoeConfig", "qwen2moe", "Qwen2MoeForCausalLM",
                       {**MOE, "shared_expert_intermediate_size": 64},
                       {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 64}),
    "qwen3moe": Family("Qwen3MoeConfig", "qwen3moe", "Qwen3MoeForCausalLM", MOE,
                       {"moe_intermediate_size": 32}),
}
MIXTRAL = Family("MixtralConfig", "llama", "LlamaForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2})


def _config(fam: Family, **over):
    return getattr(transformers, fam.config_cls)(**{**COMMON, **fam.config, **over})


def _random_state_dict(cfg) -> dict:
    """A model of `cfg` with values k/256 in [-1, 1]: exact in F32 and F16, and through Gemma's +1/-1."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():  # shared (tied) parameters once
            p.copy_(torch.randint(-256, 257, p.shape, dtype=torch.float32) / 256)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (Q/K rotary halves -> interleaved)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, arch: str, cfg, sd: dict, name: str | None = None, dtype=np.float32) -> None:
    """Write `sd` as llama.cpp would: metadata keys of `arch`, tensor names from gguf-py."""
    w = gguf.GGUFWriter(str(path), arch)
    if name:
        w.add_name(name)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope = cfg.rope_parameters
    rope = rope.get("full_attention", rope)  # Gemma3 has one set per attention type
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_vocab_size(cfg.vocab_size)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    else:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if getattr(cfg, "sliding_window", None) and arch.startswith("gemma"):
        w.add_sliding_window(cfg.sliding_window)
    n_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if n_experts:
        w.add_expert_count(n_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "moe_intermediate_size", None):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if getattr(cfg, "shared_expert_intermediate_size", None):
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_pad_token_id(cfg.pad_token_id)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else gguf.LlamaFileType.MOSTLY_F16)

    gguf_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch, gguf.MODEL_ARCH.LLAMA)
    names = gguf.get_tensor_name_map(gguf_arch, cfg.num_hidden_layers)
    for key, t in sd.items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = t.numpy()
        base, _, suffix = key.rpartition(".") if key.endswith((".weight", ".bias")) else (key, "", "weight")
        if base.endswith("mlp.experts.gate_up_proj"):  # fused [E, 2I, H]: gate rows first, then up
            bid, half = base.split(".")[2], a.shape[1] // 2
            w.add_tensor(f"blk.{bid}.ffn_gate_exps.weight", np.ascontiguousarray(a[:, :half], dtype=dtype))
            w.add_tensor(f"blk.{bid}.ffn_up_exps.weight", np.ascontiguousarray(a[:, half:], dtype=dtype))
            continue
        gname = names.get_name(base)
        assert gname, f"gguf-py has no {arch} name for {key}"
        if arch == "llama" and gname.endswith(".attn_q"):
            a = _permute(a, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch == "llama" and gname.endswith(".attn_k"):
            a = _permute(a, cfg.num_attention_heads, cfg.num_key_value_heads)
        if arch.startswith("gemma") and gname.endswith("norm"):
            a = a + 1  # Gemma's RMSNorm scales by (1 + w); llama.cpp stores 1 + w
        if gname.endswith(".ffn_gate_inp_shexp"):
            a = a.reshape(-1)  # HF [1, H], llama.cpp [H]
        w.add_tensor(f"{gname}.{suffix}", np.ascontiguousarray(a, dtype=dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _load(path: Path, **kwargs):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, output_loading_info=True,
                                                **kwargs)


def _assert_same_weights(model, sd: dict) -> None:
    got = model.state_dict()
    assert sorted(got) == sorted(sd)
    diff = [k for k in sd if got[k].shape != sd[k].shape or not torch.equal(got[k].float(), sd[k])]
    assert not diff, f"tensors that did not round-trip: {diff}"


def test_families_claimed_by_transformers():
    """The families asked about that transformers lists (mixtral is not; mistral is, but see below)."""
    asked = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2_moe", "qwen3_moe"]
    assert set(asked) <= set(GGUF_SUPPORTED_ARCHITECTURES)
    assert "mixtral" not in GGUF_SUPPORTED_ARCHITECTURES


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pipeline_reads_the_family(family, tmp_path):
    """builders.model_fetch.load_gguf_model (the embedded-model path) reads every family exactly, filling in the
    sizes transformers leaves out of the config from the file's metadata (no load_kwargs)."""
    fam = FAMILIES[family]
    cfg = _config(fam)
    sd = _random_state_dict(cfg)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, fam.arch, cfg, sd, name=fam.name)
    model = load_gguf_model(path)
    assert type(model).__name__ == fam.loaded_cls
    assert "quantization_config" not in model.config.to_dict()
    _assert_same_weights(model, sd)


def test_pipeline_refuses_mixtral_written_as_llama(tmp_path):
    cfg = _config(MIXTRAL)
    path = tmp_path / "mixtral.gguf"
    write_gguf(path, "llama", cfg, _random_state_dict(cfg))
    with pytest.raises(StageError, match="missing from the file"):
        load_gguf_model(path)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_round_trip(family, tmp_path):
    fam = FAMILIES[family]
    cfg = _config(fam)
    sd = _random_state_dict(cfg)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, fam.arch, cfg, sd, name=fam.name)

    model, info = _load(path, **fam.load_kwargs)
    assert type(model).__name__ == fam.loaded_cls
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.config.tie_word_embeddings == cfg.tie_word_embeddings
    for attr in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                 "intermediate_size", "vocab_size"):
        assert getattr(model.config, attr) == getattr(cfg, attr), attr
    _assert_same_weights(model, sd)


def test_round_trip_f16(tmp_path):
    fam = FAMILIES["llama"]
    cfg = _config(fam)
    sd = _random_state_dict(cfg)
    path = tmp_path / "llama-f16.gguf"
    write_gguf(path, fam.arch, cfg, sd, dtype=np.float16)
    model, _ = _load(path)
    _assert_same_weights(model, sd)


@pytest.mark.parametrize("family, attrs", [
    ("qwen2moe", {"moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}),
    ("qwen3moe", {"moe_intermediate_size": 768}),
    ("qwen3", {"head_dim": 128}),
])
def test_unmapped_config_keys_fall_back_to_defaults(family, attrs, tmp_path):
    """Without load_kwargs the written sizes are ignored: the config gets class defaults, the load fails."""
    fam = FAMILIES[family]
    cfg = _config(fam)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, fam.arch, cfg, _random_state_dict(cfg))
    loaded = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
    assert {k: getattr(loaded, k) for k in attrs} == attrs
    assert all(getattr(cfg, k) != v for k, v in attrs.items())
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        _load(path)


@pytest.mark.parametrize("arch, name", [("mistral", None), ("llama", "mistral")])
def test_mistral_model_type_is_refused(arch, name, tmp_path):
    """Both routes to model_type `mistral` die in get_gguf_hf_weights_map: gguf-py has no `mistral` arch."""
    cfg = _config(FAMILIES["mistral"])
    path = tmp_path / "mistral.gguf"
    write_gguf(path, arch, cfg, _random_state_dict(cfg), name=name)
    with pytest.raises(NotImplementedError, match="Unknown gguf model_type: mistral in gguf-py"):
        _load(path)


def test_mixtral_arch_is_refused(tmp_path):
    cfg = _config(MIXTRAL)
    path = tmp_path / "mixtral.gguf"
    write_gguf(path, "mixtral", cfg, _random_state_dict(cfg))
    with pytest.raises(ValueError, match="GGUF model with architecture mixtral is not supported yet"):
        _load(path)


def test_mixtral_as_llama_drops_the_experts(tmp_path):
    """llama.cpp writes Mixtral as `llama` + ffn_*_exps: transformers loads a dense Llama, experts
    ignored and its MLP left randomly initialised (only reported in the loading info)."""
    cfg = _config(MIXTRAL)
    sd = _random_state_dict(cfg)
    path = tmp_path / "mixtral.gguf"
    write_gguf(path, "llama", cfg, sd)
    assert any(t.name == "blk.0.ffn_gate_exps.weight" for t in gguf.GGUFReader(str(path)).tensors)
    model, info = _load(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not any("experts" in k for k in model.state_dict())
    assert info["missing_keys"] == {f"model.layers.{i}.mlp.{p}_proj.weight"
                                    for i in range(cfg.num_hidden_layers) for p in ("gate", "up", "down")}
    got = model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in sd.items() if "mlp" not in k)
