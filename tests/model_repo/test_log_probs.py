"""The portable runtime's prompt log probabilities (templates/tensorrt_llm_pytorch/1/log_probs.py) on a tiny random
Llama: one forward pass, position i scoring token i + 1, with the k most likely tokens; no server, seconds."""

from __future__ import annotations

import pytest

from tests.templates import template_module

log_probs = template_module("tensorrt_llm_pytorch", "log_probs")

PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1789, 30]


@pytest.fixture(scope="module")
def model(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def test_each_prompt_token_after_the_first_gets_its_log_probability_and_alternatives(model, monkeypatch):
    import torch

    with torch.no_grad():  # the reference: float64 log_softmax of the same forward, row by row
        ref = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].double(), dim=-1)
    got = log_probs.prompt_log_probs(model, PROMPT, 3)
    assert len(got.log_probs) == len(got.top_ids) == len(got.top_log_probs) == len(PROMPT) - 1
    assert got.log_probs == pytest.approx([float(ref[i, PROMPT[i + 1]]) for i in range(len(PROMPT) - 1)], abs=1e-5)
    for i in range(len(PROMPT) - 1):
        want = torch.topk(ref[i], 3)
        assert got.top_ids[i] == want.indices.tolist()
        assert got.top_log_probs[i] == pytest.approx(want.values.tolist(), abs=1e-5)
        assert got.top_log_probs[i] == sorted(got.top_log_probs[i], reverse=True)
    monkeypatch.setattr(log_probs, "CHUNK_ROWS", 3)  # a long prompt, in chunks over a KV cache: the same values
    chunked = log_probs.prompt_log_probs(model, PROMPT, 3)
    assert chunked.top_ids == got.top_ids and chunked.log_probs == pytest.approx(got.log_probs, abs=1e-5)
    assert sum(chunked.top_log_probs, []) == pytest.approx(sum(got.top_log_probs, []), abs=1e-5)
    plain = log_probs.prompt_log_probs(model, PROMPT, 0)
    assert plain.log_probs == got.log_probs and plain.top_ids == plain.top_log_probs == []


def test_a_one_token_prompt_has_none_and_the_memo_scores_a_prompt_once(model, monkeypatch):
    from types import SimpleNamespace

    assert log_probs.prompt_log_probs(model, PROMPT[:1], 2).as_tuple() == ([], [], [])
    calls = []
    real = log_probs.prompt_log_probs
    monkeypatch.setattr(log_probs, "prompt_log_probs", lambda *a: calls.append(a) or real(*a))
    manager = SimpleNamespace(model=model, _generation_step=lambda: None)
    memo = log_probs.Memo(manager)
    first = memo.get(PROMPT, 2)
    assert memo.get(list(PROMPT), 2) is first and len(calls) == 1  # the next sequence of the same request
    memo.get(PROMPT, 3)
    memo.get(PROMPT[:-1], 3)
    assert len(calls) == 3


def test_a_prompt_is_never_scored_during_a_generation_step(model):
    """The manager's generation step and a prompt's forward pass share one lock (they gave wrong log probabilities
    when they overlapped): while a step runs, scoring waits for it."""
    import threading
    import time
    from types import SimpleNamespace

    in_step, release, order = threading.Event(), threading.Event(), []

    def step():
        in_step.set()
        release.wait(30)
        order.append("step done")

    manager = SimpleNamespace(model=model, _generation_step=step)
    memo = log_probs.Memo(manager)
    loop = threading.Thread(target=manager._generation_step)  # the loop calls the wrapped step
    loop.start()
    assert in_step.wait(30)
    scorer = threading.Thread(target=lambda: order.append(("scored", len(memo.get(PROMPT, 0).log_probs))))
    scorer.start()
    time.sleep(0.2)  # give the scorer a chance to run into the step (it must not)
    assert order == []
    release.set()
    loop.join(30)
    scorer.join(30)
    assert order == ["step done", ("scored", len(PROMPT) - 1)]
