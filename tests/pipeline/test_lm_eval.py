"""lm-evaluation-harness, a client no one here wrote, against the OpenAI frontend serving the default build.

lm_eval 0.4.13 lives in its own venv (``.lmeval/``, scripts/setup.sh, pins in tests/clients/lmeval.txt) and runs as
its own process, offline, on the local tasks in tests/assets/lm_eval_tasks/ (a handful of items each, with Chinese,
French accents and emoji):

- ``trtpipe_mc`` (multiple choice, loglikelihood) through ``local-completions``: each choice is scored with
  ``echo: true, logprobs: 1, max_tokens: 1`` on the prompt, as text (``tokenized_requests=False``) and as token ids
  (``True``). Every choice's log-likelihood, its is-greedy flag, ``acc`` and ``acc_norm`` must be what transformers'
  own log-softmax over the same served checkpoint (the build's ``engine/``) gives on the same token ids.
- ``trtpipe_gen`` (generate_until) through ``local-chat-completions --apply_chat_template``: every answer must be
  transformers' greedy answer to the same chat-templated prompt, cut where lm_eval's ``until`` cuts it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ASSETS, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LM_EVAL = REPO / ".lmeval" / "bin" / "lm_eval"
TASKS = ASSETS / "lm_eval_tasks"
MODEL = "smollm2-135m"
DELIMITER = " "
"""trtpipe_mc.yaml's target_delimiter: lm_eval scores ``delimiter + choice`` after ``question``."""
UNTIL = "\n\n"
"""trtpipe_gen.yaml's generation_kwargs.until (and max_gen_toks below)."""
MAX_GEN_TOKS = 24


def _items(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def run_lm_eval(out: Path, model: str, endpoint: str, url: str, tokenizer: Path, task: str, *extra: str,
                may_fail: bool = False, **model_args) -> tuple[dict, list[dict], str]:
    """Run lm_eval offline from the repository root (the tasks' data_files are relative to it); return its results
    JSON, the task's logged samples and its output. Fails with the tail of its output when it exits non-zero
    (``may_fail``: returns ``({}, [], output)`` instead)."""
    assert LM_EVAL.is_file(), f"{LM_EVAL} is missing: run `bash scripts/setup.sh --tools` (it creates .lmeval/)"
    args = {"model": MODEL, "base_url": f"{url}/v1/{endpoint}", "tokenizer": str(tokenizer), "num_concurrent": 1,
            "max_retries": 1, **model_args}
    cmd = [str(LM_EVAL), "--model", model, "--model_args", ",".join(f"{k}={v}" for k, v in args.items()),
           "--include_path", str(TASKS.relative_to(REPO)), "--tasks", task, "--output_path", str(out),
           "--log_samples", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(out / "hf"),
           "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = p.stdout + p.stderr
    if may_fail and p.returncode != 0:
        return {}, [], log
    assert p.returncode == 0, f"lm_eval exited {p.returncode}: {' '.join(cmd)}\n{log[-4000:]}"
    results = sorted(out.rglob("results_*.json"))
    samples = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    assert results and samples, f"lm_eval wrote no results or samples under {out}:\n{log[-2000:]}"
    rows = [json.loads(line) for line in samples[-1].read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(results[-1].read_text(encoding="utf-8")), sorted(rows, key=lambda r: r["doc_id"]), log


@pytest.fixture(scope="module")
def hf(built_default):
    """transformers' own tokenizer and model of the served checkpoint (float32, as the cpu target serves it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = built_default / "engine"
    tok = AutoTokenizer.from_pretrained(str(engine), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(engine), dtype=torch.float32, local_files_only=True).eval()
    return tok, model


def _pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm_eval's split of a (context, continuation) pair for a causal model (TemplateAPI, no BOS added): trailing
    spaces of the context move to the continuation, the whole is tokenized once, the context's own token count
    splits it."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok(context + continuation, add_special_tokens=False).input_ids
    ctx = tok(context, add_special_tokens=False).input_ids
    return ctx, whole[len(ctx):]


@pytest.fixture(scope="module")
def mc_reference(hf):
    """Per item: [(log-likelihood, is_greedy) per choice], acc and acc_norm, from transformers' log-softmax."""
    import numpy as np
    import torch

    tok, model = hf
    out = []
    for item in _items("mc.jsonl"):
        scored = []
        for choice in item["choices"]:
            ctx, cont = _pair(tok, item["question"], DELIMITER + choice)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits[0].float(), dim=-1)
            rows = logp[len(ctx) - 1:len(ctx) - 1 + len(cont)]
            ll = sum(rows[i, t].item() for i, t in enumerate(cont))
            scored.append((ll, all(rows[i].argmax().item() == t for i, t in enumerate(cont))))
        lls = np.array([s[0] for s in scored])
        lengths = np.array([float(len(c)) for c in item["choices"]])  # lm_eval's acc_norm: by characters
        out.append({"choices": scored, "acc": float(np.argmax(lls) == item["answer"]),
                    "acc_norm": float(np.argmax(lls / lengths) == item["answer"])})
    return out


@pytest.mark.parametrize("tokenized", [False, True], ids=["text-prompts", "token-id-prompts"])
def test_loglikelihood_task_scores_what_transformers_scores(frontend, built_default, mc_reference, lm_eval_once,
                                                            tokenized):
    results, samples, _ = lm_eval_once("local-completions", "completions", frontend.launch.url,
                                       built_default / "engine", "trtpipe_mc", tokenized_requests=tokenized)
    task = results["results"]["trtpipe_mc"]
    assert all(isinstance(task[m], float) and math.isfinite(task[m]) for m in ("acc,none", "acc_norm,none"))
    items = _items("mc.jsonl")
    assert [s["doc_id"] for s in samples] == list(range(len(items))) == list(range(len(mc_reference)))
    for s, item, ref in zip(samples, items, mc_reference):
        # what lm_eval scored is what the reference scored: the same context and continuation strings
        asked = [(a["arg_0"], a["arg_1"]) for a in s["arguments"].values()]
        assert asked == [(item["question"], DELIMITER + c) for c in item["choices"]], s["arguments"]
        served = [(float(ll), flag in (True, "True")) for ll, flag in s["filtered_resps"]]
        for (ll, greedy), (ref_ll, ref_greedy), choice in zip(served, ref["choices"], item["choices"]):
            assert ll == pytest.approx(ref_ll, abs=1e-3), (item["question"], choice)
            assert greedy == ref_greedy, (item["question"], choice)
        assert (s["acc"], s["acc_norm"]) == (ref["acc"], ref["acc_norm"]), item["question"]
    n = len(items)
    assert task["acc,none"] == pytest.approx(sum(r["acc"] for r in mc_reference) / n, abs=1e-12)
    assert task["acc_norm,none"] == pytest.approx(sum(r["acc_norm"] for r in mc_reference) / n, abs=1e-12)


def test_loglikelihood_task_with_batched_token_id_prompts(frontend, built_default, mc_reference, lm_eval_once):
    """lm_eval's ``--batch_size 4`` sends four token-id prompts in one completion request, as OpenAI's legacy API
    and vLLM take them, and reads each choice by its ``index``: the scores are the reference's, item by item."""
    results, samples, _ = lm_eval_once("local-completions", "completions", frontend.launch.url,
                                       built_default / "engine", "trtpipe_mc", "--batch_size", "4",
                                       tokenized_requests=True)
    samples = sorted(samples, key=lambda s: s["doc_id"])  # logged in the order lm_eval batched them
    assert [s["doc_id"] for s in samples] == list(range(len(mc_reference)))
    for s, ref in zip(samples, mc_reference):
        served = [(float(ll), flag in (True, "True")) for ll, flag in s["filtered_resps"]]
        assert [ll for ll, _ in served] == pytest.approx([ll for ll, _ in ref["choices"]], abs=1e-3)
        assert [g for _, g in served] == [g for _, g in ref["choices"]]
    task = results["results"]["trtpipe_mc"]
    assert task["acc,none"] == pytest.approx(sum(r["acc"] for r in mc_reference) / len(mc_reference), abs=1e-12)


def test_generate_until_task_through_chat_answers_what_transformers_answers(frontend, built_default, hf, lm_eval_once):
    import torch

    results, samples, _ = lm_eval_once("local-chat-completions", "chat/completions", frontend.launch.url,
                                       built_default / "engine", "trtpipe_gen", "--apply_chat_template")
    em = results["results"]["trtpipe_gen"]["exact_match,none"]
    assert isinstance(em, float) and 0.0 <= em <= 1.0
    items = _items("gen.jsonl")
    assert [s["doc_id"] for s in samples] == list(range(len(items)))
    tok, model = hf
    answers = []
    for s, item in zip(samples, items):
        sent = s["arguments"]["gen_args_0"]["arg_0"]  # the chat lm_eval sent: a JSON string (in a list when logged)
        messages = json.loads(sent[0] if isinstance(sent, list) else sent)
        assert messages == [{"role": "user", "content": item["question"]}]
        answer = s["resps"][0][0]
        assert isinstance(answer, str) and answer and "\ufffd" not in answer, (item["question"], answer)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        with torch.no_grad():
            greedy = model.generate(ids, max_new_tokens=MAX_GEN_TOKS, do_sample=False)
        expected = tok.decode(greedy[0, ids.shape[1]:], skip_special_tokens=True).split(UNTIL)[0]
        assert answer == expected, item["question"]
        answers.append(answer)
    assert any(not a.isascii() for a in answers)  # non-ASCII answers came back whole
