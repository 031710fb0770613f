"""Pre-quantized sources through the whole pipeline.

* The embedded SmolLM2 compressed to FP8 by compressed-tensors itself, built for the cpu target with the float model
  as model.reference: the quantize stage is skipped, verify scores it against the reference, and a real tritonserver
  serves greedy tokens equal to transformers' own loading of the FP8 checkpoint (compressed-tensors, dequantized),
  for ASCII, CJK + emoji and accented prompts, by ids and by text (streamed and not).
* An AutoAWQ checkpoint without a reference: verify says so in verify.json and the manifest.
* A ModelOpt export (the pipeline's own, FP8) as the source of the trtllm-llmapi runtime: linked as it is into the
  engine folder; the trtllm runtime refuses it, naming trtllm-llmapi.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from builders.spec import load_spec
from pipeline.build import run_build
from plugins.errors import SpecError
from tests.bad_input import Server, send
from tests.conftest import smollm2_tokenizer_dir, start_server, tiny_llama_model, write_spec
from tests.prequant_formats import copy_tokenizer, write_awq, write_compressed_fp8

MAX_TOKENS = 12
PROMPTS = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\n東京で一番有名な食べ物は？ 🍣<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nÉcris une phrase sur la mer.<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("prequant-fp8")
    base = smollm2_tokenizer_dir()
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    src = write_compressed_fp8(model, root / "smol-fp8", strategy="channel", tokenizer_src=base)
    spec = root / "fp8.yaml"
    spec.write_text("name: smol-fp8\n"
                    "model: {source: ./smol-fp8, reference: 'embedded:smollm2-135m-instruct'}\n"
                    "limits: {max_batch_size: 4, max_input_len: 256, max_seq_len: 512, max_num_tokens: 512}\n"
                    "gates: {eval_samples: 2, eval_seq_len: 128}\n"
                    "targets:\n  cpu: {}\n")
    build = load_spec(spec, "cpu")
    manifest = run_build(build, out_root=root / "build", progress=False)
    return src, root / "build" / "smol-fp8" / "cpu", manifest


@pytest.mark.slow
def test_a_prequantized_source_skips_quantization_and_is_verified_against_its_reference(fp8_build):
    src, out, manifest = fp8_build
    quant = manifest["source_checkpoint"]["quantization"]
    assert (quant["method"], quant["quant_algo"]) == ("compressed-tensors", "FP8_PER_CHANNEL_PER_TOKEN")
    assert manifest["stages"]["checkpoint"]["info"]["skipped"] and manifest["stages"]["checkpoint"]["path"] == str(src)
    assert not (out / "checkpoint").exists()  # nothing quantized, nothing written
    report = json.loads((out / "verify" / "verify.json").read_text())
    assert report["reference"].endswith(tuple(p.name for p in [smollm2_tokenizer_dir()]))
    assert report["checkpoint_format"] == "hf_compressed-tensors" and report["passed"]
    m = report["metrics"]
    assert 0.9 < m["top1_agreement"] < 1.0 and 0 < m["mean_kl"] < 0.05  # FP8's real error, small
    plan = json.loads((out / "plan.json").read_text())
    assert plan["source_quantization"]["method"] == "compressed-tensors" and plan["quant_algo"] == "fp8"


@pytest.fixture(scope="module")
def fp8_server(fp8_build, tmp_path_factory):
    server = start_server(fp8_build[1] / "model_repo", tmp_path_factory.mktemp("fp8-server"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def transformers_tokens(fp8_build):
    """transformers' own greedy tokens on the FP8 checkpoint, loaded by its compressed-tensors integration."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import CompressedTensorsConfig

    src = fp8_build[0]
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="sdpa",
                                                 quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
    end = json.loads((src / "generation_config.json").read_text()).get("eos_token_id")
    ends = end if isinstance(end, list) else [end]
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok.encode(p, add_special_tokens=False)
            gen = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=end,
                                 pad_token_id=tok.pad_token_id or 0)[0, len(ids):].tolist()
            out.append((ids, gen[:-1] if gen and gen[-1] in ends else gen, tok))
    return out


def _outputs(server, model: str, named: dict, output: str, mode: str) -> list:
    reply = send(Server(server.cfg.grpc_url, server.cfg.http_url), model, named, mode, timeout_s=300)
    if reply.error is not None or reply.hung:
        raise RuntimeError(reply.error or "no final response")
    return [x for out in reply.outputs if out.get(output) is not None and out[output].size
            for x in out[output].reshape(-1).tolist()]


@pytest.mark.e2e
@pytest.mark.slow
def test_served_tokens_equal_transformers_loading_of_the_fp8_checkpoint(fp8_server, transformers_tokens):
    for ids, expected, _ in transformers_tokens:
        named = {"input_ids": (np.array([ids], np.int32), "INT32"),
                 "input_lengths": (np.array([[len(ids)]], np.int32), "INT32"),
                 "request_output_len": (np.array([[MAX_TOKENS]], np.int32), "INT32"),
                 "streaming": (np.array([[True]]), "BOOL")}
        got = _outputs(fp8_server, "tensorrt_llm", named, "output_ids", "stream")
        assert got == expected, (ids[-8:], got, expected)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["stream", "infer"])
def test_served_text_of_the_fp8_checkpoint_is_transformers_text(fp8_server, transformers_tokens, mode):
    """Text in, text out through the ensemble (non-ASCII prompts), streamed and not; a last character the token
    budget cuts in half is not sent (trtpipe_runtime/detokenize.py), so it is not expected."""
    for i, (ids, expected, tok) in enumerate(transformers_tokens):
        named = {"text_input": (np.array([[PROMPTS[i].encode()]], dtype=object), "BYTES"),
                 "max_tokens": (np.array([[MAX_TOKENS]], np.int32), "INT32"),
                 "stream": (np.array([[mode == "stream"]]), "BOOL"),
                 "exclude_input_in_output": (np.array([[True]]), "BOOL")}  # upstream's ensemble echoes it otherwise
        parts = _outputs(fp8_server, "ensemble", named, "text_output", mode)
        assert "".join(p.decode() for p in parts) == tok.decode(expected, skip_special_tokens=True).rstrip("\ufffd")


@pytest.mark.slow
def test_without_a_reference_verify_says_so(tmp_path):
    model = tiny_llama_model(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    src = write_awq(model, tmp_path / "awq", group_size=32, tokenizer_src=smollm2_tokenizer_dir())
    build = load_spec(write_spec(tmp_path / "b.yaml", src, target="cpu", runtime="pytorch", quant="int4_awq"), "cpu")
    manifest = run_build(build, out_root=tmp_path / "build", progress=False, stop_after="verify")
    verify = manifest["stages"]["verify"]["info"]
    assert verify["reference"] is None and "no reference" in verify["note"] and verify["passed"]
    report = json.loads((tmp_path / "build" / "tiny" / "cpu" / "verify" / "verify.json").read_text())
    assert report["reference"] is None and set(report["metrics"]) == {"perplexity", "positions", "nonfinite_logits"}
    assert [g["field"] for g in report["gates"]] == ["finite"]


@pytest.fixture(scope="module")
def modelopt_fp8(tmp_path_factory):
    """The pipeline's own ModelOpt FP8 unified HF export of a tiny Llama: a ModelOpt pre-quantized checkpoint."""
    from transformers import AutoTokenizer

    from builders.calibration import token_windows
    from builders.quantize_hf import quantize_to_hf_checkpoint

    root = tmp_path_factory.mktemp("modelopt-src")
    tiny_llama_model(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(root / "float")
    copy_tokenizer(smollm2_tokenizer_dir(), root / "float")
    tok = AutoTokenizer.from_pretrained(root / "float")
    quantize_to_hf_checkpoint(root / "float", root / "fp8", quant_algo="fp8", group_size=128, kv_cache_quant_algo=None,
                              dtype="float16", calib_samples=token_windows(tok, "calibration", 2, 32, 0))
    copy_tokenizer(root / "float", root / "fp8")
    return root


@pytest.mark.slow
def test_a_modelopt_checkpoint_is_served_as_it_is_by_the_llm_api(modelopt_fp8, tmp_path):
    spec = write_spec(tmp_path / "b.yaml", modelopt_fp8 / "fp8", runtime="trtllm-llmapi", quant="fp8")
    spec.write_text(spec.read_text().replace("model: {source: ", f"model: {{reference: {modelopt_fp8 / 'float'}, "
                                                                 "source: "))
    build = load_spec(spec, "h100")
    manifest = run_build(build, out_root=tmp_path / "build", progress=False, stop_after="engine")
    engine = tmp_path / "build" / "tiny" / "h100" / "engine"
    hq = json.loads((engine / "hf_quant_config.json").read_text())
    assert hq["quantization"]["quant_algo"] == "FP8"
    assert manifest["stages"]["verify"]["info"]["metrics"]["top1_agreement"] > 0.5
    refused = load_spec(write_spec(tmp_path / "c.yaml", modelopt_fp8 / "fp8", runtime="trtllm", quant="fp8"), "h100")
    with pytest.raises(SpecError) as err:
        run_build(refused, out_root=tmp_path / "build2", progress=False)
    p = next(p for p in err.value.problems if p.code == "prequant_runtime")
    assert "trtllm-llmapi" in p.fix and "ModelOpt FP8" in p.rule
    assert not (tmp_path / "build2" / "tiny").exists() or not any((tmp_path / "build2" / "tiny").rglob("stage.json"))
