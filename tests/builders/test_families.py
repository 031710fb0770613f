"""Every family of plugins.architectures x {none, fp8, int4_awq} through ModelOpt's export and our readers.

Tiny random checkpoints (tests/families.py) are quantized with ModelOpt and exported in each format the
registry says ModelOpt 0.47 writes for the family: the TensorRT-LLM checkpoint for every (tp, pp) in {1,2}^2,
and the unified HF checkpoint (not sharded: TensorRT-LLM's LLM API shards it when it loads). Checked:

- the reader (builders.checkpoint.read_checkpoint) gives back the source's exact fp16 bits for ``none``, and
  ModelOpt's own fake-quant weights for fp8 / int4_awq;
- the planner's weight bytes per rank equal the bytes of the exported tensors of that rank, to the scalar
  activation / KV scales the plan does not count;
- the planner's KV bytes per token equal what the portable runtime's paged cache allocates for the config;
- what the registry refuses really fails upstream (the TensorRT-LLM export of Gemma/Phi-3/MoE, INT4 of fused
  experts), so this file fails when ModelOpt starts to support it and the registry should follow.

Marked slow: ModelOpt quantization and export in every test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from builders.checkpoint import read_checkpoint
from builders.quantize import export_checkpoint, quantize_model
from builders.spec import load_spec
from plugins.architectures import ARCHITECTURES, support
from plugins.errors import StageError
from plugins.recipes import recipe
from plugins.runtimes import RUNTIMES
from tests.families import FAMILIES, SHORT, fake_quant_weights, tiny_model

pytestmark = pytest.mark.slow

QUANTS = ["none", "fp8", "int4_awq", "nvfp4"]
MAPPINGS = [(1, 1), (2, 1), (1, 2), (2, 2)]
GROUP = 32


def _cases(quants=tuple(QUANTS), mappings=tuple(MAPPINGS)):
    out = []
    for arch in FAMILIES:
        a = ARCHITECTURES[arch]
        for quant in quants:
            for fmt in a.checkpoint_formats:
                if fmt not in recipe(quant).checkpoint_formats:
                    continue  # NVFP4: the unified checkpoint only
                if fmt == "hf_unified" and a.moe is not None and recipe(quant).uses_group_size:
                    continue  # refused: test_refusals_are_real
                for tp, pp in (mappings if fmt == "trtllm" else [(1, 1)]):
                    out.append(pytest.param(arch, quant, fmt, tp, pp, id=f"{SHORT[arch]}-{quant}-{fmt}-tp{tp}pp{pp}"))
    return out


def calib_samples():
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, 49152, (2, 16), generator=g).tolist()


class Exports:
    """One quantized model per (family, quant), exported once per (format, tp, pp); cached for the module."""

    def __init__(self, root: Path):
        self.root, self.models, self.fake, self.source, self.dirs = root, {}, {}, {}, {}

    def model(self, arch, quant):
        key = (arch, quant)
        if key not in self.models:
            m = tiny_model(arch).to(torch.float16).to(torch.float32)  # fp16-representable source weights
            self.source[key] = {k: v.clone() for k, v in m.state_dict().items()}
            quantize_model(m, quant_algo=quant, group_size=GROUP, kv_cache_quant_algo=None,
                           calib_samples=calib_samples())
            self.models[key], self.fake[key] = m, fake_quant_weights(m)
        return self.models[key]

    def export(self, arch, quant, fmt, tp, pp) -> Path:
        key = (arch, quant, fmt, tp, pp)
        if key not in self.dirs:
            out = self.root / "-".join(map(str, (SHORT[arch], quant, fmt, tp, pp)))
            out.mkdir()
            m = self.model(arch, quant)
            if fmt == "trtllm":
                export_checkpoint(m, out, quant_algo=quant, group_size=GROUP, dtype="float16", tp_size=tp,
                                  pp_size=pp, decoder_type=ARCHITECTURES[arch].decoder_type)
            else:
                from modelopt.torch.export import export_hf_checkpoint

                copy = tiny_model(arch) if quant == "none" else None
                with torch.inference_mode():
                    if copy is not None:
                        copy.load_state_dict(self.source[(arch, quant)])
                        copy.to(torch.float16).save_pretrained(str(out))
                    else:
                        m.to(torch.float16)
                        export_hf_checkpoint(m, export_dir=str(out))
                        m.to(torch.float32)
            self.dirs[key] = out
        return self.dirs[key]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return Exports(tmp_path_factory.mktemp("families"))


def _load_as_model(arch, sd):
    """The dequantized state dict loaded the way the stages do (an HF folder read by from_pretrained)."""
    import tempfile

    from builders.checkpoint import write_hf_folder
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as tmp:
        tiny_model(arch).save_pretrained(src)
        write_hf_folder(sd, Path(src), Path(tmp), torch.float32, tie_word_embeddings="lm_head.weight" not in sd)
        model, info = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model


# int4_gptq: layer-by-layer calibration runs on every family (Gemma 2/3 needed use_cache=False: builders/quantize.py)
@pytest.mark.parametrize("arch,quant,fmt,tp,pp", _cases() + _cases(("int4_gptq",), ((1, 1),)))
def test_export_reads_back(exports, arch, quant, fmt, tp, pp):
    ckpt = exports.export(arch, quant, fmt, tp, pp)
    sd, info = read_checkpoint(ckpt, vocab_size=49152)
    assert info.format == fmt and (info.tp_size, info.pp_size) == ((tp, pp) if fmt == "trtllm" else (1, 1))
    model = _load_as_model(arch, sd)  # every tensor maps onto the family's model
    got = model.state_dict()
    src = exports.source[(arch, quant)]
    assert set(got) == set(src)
    if quant == "none":
        for k, v in src.items():
            assert torch.equal(got[k], v), k  # bit-exact: the source weights are fp16 values
        return
    fake = exports.fake[(arch, quant)]
    assert fake, "ModelOpt enabled no weight quantizer"
    checked = 0
    for name, mod in model.named_modules():
        key = f"{name}.weight"
        if key not in fake:
            continue
        ref, w, s = fake[key], mod.weight.detach(), src[key]
        # Relative to the quantization error itself (source vs fake-quant): layers exported as quantized
        # (o_proj, down_proj) differ from the fake-quant weight only by fp16 scale storage and the fp16 cast before
        # the unified export (a few elements round to the neighbouring grid value); merged ones (q/k/v, gate/up
        # share a scale) are re-quantized by the exporter. A wrong dequantization is off by the weight's own size.
        exact = name.endswith(("o_proj", "down_proj"))
        err, qerr = (w - ref).norm() / ref.norm(), (s - ref).norm() / ref.norm()
        assert err <= max((0.5 if exact else 2.0) * qerr, 2e-3), (key, float(err), float(qerr))
        checked += 1
    assert checked, "no quantized linear layer was compared"


KV_SCALES = ("cache_scaling_factor", "k_scale", "v_scale")
"""KV-cache scales of both formats (none here: no kv_cache_quant_algo): the plan counts them with the KV cache."""


def _bytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _plan_for(arch, quant, fmt, tp, pp, tmp_path):
    from builders.plan import compute_plan
    from plugins.targets import get_target

    runtime = "trtllm" if fmt == "trtllm" else "trtllm-llmapi"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nmodel: {{source: {tmp_path}}}\ndtype: float16\nruntime: {runtime}\n"
                    f"quantization: {{quant_algo: {quant}, group_size: {GROUP}}}\n"
                    f"parallelism: {{tp_size: {tp}, pp_size: {pp}}}\ntargets: {{h100: {{}}}}\n")
    cfg = tiny_model(arch).config.to_dict()
    return compute_plan(load_spec(spec, "h100"), get_target("h100"), cfg)


@pytest.mark.parametrize("arch,quant,fmt,tp,pp", _cases())
def test_planned_weight_bytes_are_the_exported_bytes(exports, arch, quant, fmt, tp, pp, tmp_path):
    from safetensors import safe_open

    ckpt = exports.export(arch, quant, fmt, tp, pp)
    plan = _plan_for(arch, quant, fmt, tp, pp, tmp_path)
    assert plan.checkpoint_format in (fmt, None)
    files = sorted(ckpt.glob("rank*.safetensors")) or sorted(ckpt.glob("*.safetensors"))
    per_file = []
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            t = {k: fh.get_tensor(k) for k in fh.keys()}
        unplanned = {k: v for k, v in t.items() if k.endswith(KV_SCALES)}
        per_file.append((_bytes(t) - _bytes(unplanned), _bytes(unplanned)))
    if fmt == "trtllm":  # heaviest tensor-parallel rank of each pipeline stage
        got = [max(per_file[p * tp + r][0] for r in range(tp)) for p in range(pp)]
    else:
        got = [sum(b for b, _ in per_file)]
    # The plan counts one per-tensor scale pair per fused linear (qkv, gate+up as TensorRT-LLM holds them); the
    # unified HF checkpoint keeps q/k/v and gate/up apart (a few more 4-byte scalars per layer) and folds q/k/v's
    # AWQ pre-quant scale into the norm before it (a few hidden-sized vectors fewer): within that, exact.
    layers = ckpt_layers = tiny_model(arch).config.num_hidden_layers // (pp if fmt == "trtllm" else 1)
    slack = 0 if fmt == "trtllm" or quant == "none" else ckpt_layers * (64 + 3 * 64 * 2)
    for g, p in zip(got, plan.memory.weights_bytes_by_pp_rank):
        assert abs(g - p) <= slack, (got, plan.memory.weights_bytes_by_pp_rank, plan.memory.weights_breakdown, layers)


@pytest.mark.parametrize("arch", list(FAMILIES), ids=[SHORT[a] for a in FAMILIES])
def test_planned_kv_bytes_are_the_portable_runtime_cache(arch, tmp_path):
    """The plan's KV bytes per token (portable runtime, float32 on CPU) = what transformers' paged cache allocates
    per token for this config (generation/continuous_batching: num_hidden_layers x one full-attention page)."""
    from builders.plan import compute_plan
    from plugins.targets import get_target
    from transformers.generation.continuous_batching.cache_allocators.full_attention import (
        FullAttentionCacheAllocator)
    from transformers.generation.continuous_batching.utils import find_head_dim

    model = tiny_model(arch)
    cfg = model.config
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nmodel: {{source: {tmp_path}}}\nruntime: pytorch\nquantization: {{quant_algo: none}}\n"
                    "targets: {cpu: {}}\n")
    plan = compute_plan(load_spec(spec, "cpu"), get_target("cpu"), cfg.to_dict())
    page = 32
    runtime = cfg.num_hidden_layers * FullAttentionCacheAllocator.get_bytes_per_page(
        cfg.num_key_value_heads, find_head_dim(cfg), torch.float32, page) // page
    assert plan.memory.kv.bytes_per_token == runtime


REFUSED_TRTLLM_EXPORT = [a for a, e in ARCHITECTURES.items() if "trtllm" not in e.checkpoint_formats]


@pytest.mark.parametrize("arch", REFUSED_TRTLLM_EXPORT, ids=[SHORT[a] for a in REFUSED_TRTLLM_EXPORT])
def test_refusals_are_real(arch, tmp_path):
    """What the registry refuses fails in ModelOpt 0.47 itself: the TensorRT-LLM checkpoint export, and INT4 of
    fused MoE experts in the unified export. When one starts to pass, update plugins/architectures.py."""
    a = ARCHITECTURES[arch]
    assert not support(a, RUNTIMES["trtllm"], recipe("fp8")).ok
    m = tiny_model(arch)
    with pytest.raises(StageError, match="export to a TensorRT-LLM checkpoint"):
        with torch.inference_mode():
            export_checkpoint(m, tmp_path / "trtllm", quant_algo="none", group_size=GROUP, dtype="float16",
                              tp_size=1, pp_size=1, decoder_type=a.decoder_type)
    if a.moe is not None:
        from modelopt.torch.export import export_hf_checkpoint

        assert not support(a, RUNTIMES["trtllm-llmapi"], recipe("int4_awq")).ok
        quantize_model(m, quant_algo="int4_awq", group_size=GROUP, kv_cache_quant_algo=None,
                       calib_samples=calib_samples())
        with pytest.raises(TypeError, match="has no len"):
            with torch.inference_mode():
                export_hf_checkpoint(m.to(torch.float16), export_dir=str(tmp_path / "hf"))


def test_qwen_checkpoints_carry_what_the_engine_path_reads(exports):
    """TensorRT-LLM's qwen model reads qwen_type with no default and attn_bias defaulting to true
    (tests/facts/trtllm_1_2_1/model_families.json "qwen"): the export fills both in."""
    facts = json.loads((Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" /
                        "model_families.json").read_text())["qwen"]
    for arch, qwen_type, bias in (("Qwen2ForCausalLM", "qwen2", True), ("Qwen3ForCausalLM", "qwen3", False)):
        ckpt = exports.export(arch, "none", "trtllm", 1, 1)
        cfg = json.loads((ckpt / "config.json").read_text())
        assert cfg["qwen_type"] == qwen_type and qwen_type in facts["valid_types"]
        assert cfg["attn_bias"] is bias
