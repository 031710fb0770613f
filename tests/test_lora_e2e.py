"""LoRA adapters through a real tritonserver on the portable runtime: the build of the embedded model with two PEFT
adapters made from it by peft's own API (tests/conftest.py lora_build), served by one deployment.

Each adapter's greedy tokens through the server equal transformers + peft's own greedy generation on the served base
(the quantized checkpoint dequantized: the engine folder), a concurrent streaming batch that mixes the base and both
adapters gives each request exactly its single-request answer, and the ensemble and BLS take upstream's
``lora_task_id`` with text in and out (non-ASCII included)."""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest

from tests.bad_input import Server, send

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_TOKENS = 16
PROMPTS = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\n東京で一番有名な食べ物は？ 🍣<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nÉcris une phrase sur la mer.<|im_end|>\n<|im_start|>assistant\n")


def _stream(server, model: str, named: dict, output: str) -> list:
    """Every response's ``output`` (flattened) of one streamed request (tests/bad_input.py send), or raise its error."""
    reply = send(Server(server.cfg.grpc_url, server.cfg.http_url), model, named, "stream", timeout_s=300)
    if reply.error is not None or reply.hung:
        raise RuntimeError(reply.error or "no final response")
    return [x for out in reply.outputs if out.get(output) is not None and out[output].size
            for x in out[output].reshape(-1).tolist()]


def _generate(server, ids: list[int], task_id: int | None) -> list[int]:
    named = {"input_ids": (np.array([ids], np.int32), "INT32"),
             "input_lengths": (np.array([[len(ids)]], np.int32), "INT32"),
             "request_output_len": (np.array([[MAX_TOKENS]], np.int32), "INT32"),
             "streaming": (np.array([[True]]), "BOOL")}
    if task_id is not None:
        named["lora_task_id"] = (np.array([[task_id]], np.uint64), "UINT64")
    return _stream(server, "tensorrt_llm", named, "output_ids")


def _text(server, model: str, prompt: str, task_id: int) -> str:
    named = {"text_input": (np.array([[prompt.encode()]], dtype=object), "BYTES"),
             "max_tokens": (np.array([[MAX_TOKENS]], np.int32), "INT32"),
             "stream": (np.array([[True]]), "BOOL"),
             "lora_task_id": (np.array([[task_id]], np.uint64), "UINT64")}
    return "".join(p.decode() for p in _stream(server, model, named, "text_output"))


@pytest.fixture(scope="module")
def reference(lora_build):
    """transformers + peft's own greedy tokens on the served base (engine folder, float32, as the cpu runtime)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out, folders = lora_build
    engine = out / "engine"
    tok = AutoTokenizer.from_pretrained(engine)
    end = json.loads((engine / "generation_config.json").read_text()).get("eos_token_id")
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    answers = {}
    for task_id, name in enumerate((None, *folders), start=0):
        model = AutoModelForCausalLM.from_pretrained(engine, dtype=torch.float32, attn_implementation="sdpa")
        if name is not None:
            model = PeftModel.from_pretrained(model, str(folders[name]))
        model.eval()
        with torch.no_grad():
            for i, x in enumerate(ids):
                gen = model.generate(torch.tensor([x]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                     eos_token_id=end, pad_token_id=tok.pad_token_id or 0)
                tokens = gen[0, len(x):].tolist()
                ends = end if isinstance(end, list) else [end]
                answers[(i, task_id)] = tokens[:-1] if tokens and tokens[-1] in ends else tokens  # served: no end id
    return ids, answers


def test_each_adapter_equals_peft_on_the_served_base(lora_server, reference):
    ids, want = reference
    for (i, task_id), tokens in want.items():
        served = _generate(lora_server, ids[i], task_id)
        assert served == tokens, (i, task_id, served, tokens)
    for i in range(len(ids)):  # the adapters change the answers (else nothing here tells them apart)
        assert len({tuple(want[(i, t)]) for t in (0, 1, 2)}) == 3, i


def test_mixed_concurrent_batch_gives_each_request_its_single_answer(lora_server, reference):
    ids, _ = reference
    jobs = [(i, t) for i in range(len(ids)) for t in (None, 1, 2, 0)]
    alone = {job: _generate(lora_server, ids[job[0]], job[1]) for job in jobs}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = dict(zip(jobs, pool.map(lambda job: _generate(lora_server, ids[job[0]], job[1]), jobs)))
    assert together == alone


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_text_models_take_lora_task_id(lora_server, model):
    base, fr, de = (_text(lora_server, model, PROMPTS[1], t) for t in (0, 1, 2))
    assert len({base, fr, de}) == 3 and "\ufffd" not in base + fr + de
    with pytest.raises(RuntimeError, match=r"lora_task_id = 9 is not served \(adapters of this build: 1 \(fr\), "
                                           r"2 \(de\)\)"):
        _text(lora_server, model, PROMPTS[0], 9)
    assert _text(lora_server, model, PROMPTS[1], 1) == fr  # the server keeps serving after a refused one


def test_verify_scored_each_adapter(lora_build):
    _, out, _ = lora_build
    report = json.loads((out / "verify" / "verify.json").read_text())
    assert set(report["adapters"]) == {"fr", "de"}
    for name, scored in report["adapters"].items():
        m = scored["metrics"]
        assert m["positions"] > 0 and 0.0 < m["top1_agreement"] <= 1.0 and m["mean_kl"] >= 0.0, name
    plan = json.loads((out / "plan.json").read_text())
    assert [a["name"] for a in plan["lora"]["adapters"]] == ["fr", "de"]
    assert plan["memory"]["lora_cache_bytes"] == plan["lora"]["gpu_cache_bytes"] > 0
