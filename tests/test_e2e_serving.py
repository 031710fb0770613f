"""The main job end to end: the default build served by the real tritonserver.

Starts tritonserver on the quantized SmolLM2-135M repository and talks to the ensemble over
gRPC streaming, exactly as `make serve` + `make query` do. No mocks.
"""

from __future__ import annotations

import queue
import threading
import urllib.request

import pytest

from pipeline.client import RequestFailed, format_chat, stream_generate

pytestmark = pytest.mark.e2e

UNUSED_TOKEN = 49151  # a vocabulary id SmolLM2 never emits in these prompts: generation runs to max_tokens


def _chat(built_default, text):
    return format_chat(built_default / "engine", text)


def _collect(server, text, max_tokens, **kw):
    return list(stream_generate(server.cfg.grpc_url, text, max_tokens, timeout_s=120, **kw))


def _metric(server, state: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.cfg.metrics_port}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith("trtpipe_runtime_requests{") and f'state="{state}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric state={state} not exported")


def test_quantized_model_answers_a_factual_question(default_server, built_default):
    chunks = _collect(default_server, _chat(built_default, "What is the capital of France?"), 32)
    text = "".join(c.text for c in chunks)
    assert "Paris" in text, text


def test_streams_in_chunks_and_stops_at_eos(default_server, built_default):
    max_tokens = 64
    chunks = _collect(default_server, _chat(built_default, "What is the capital of France?"), max_tokens)
    with_tokens = [c for c in chunks if c.num_tokens > 0]
    assert len(with_tokens) > 1, "the answer arrived in one piece: not streamed"
    assert chunks[-1].final
    total = sum(c.num_tokens for c in chunks)
    assert 0 < total < max_tokens, f"{total} tokens: generation did not stop at EOS"


def test_in_flight_batching_admits_a_request_while_another_generates(default_server, built_default):
    """B is sent after A has started streaming and finishes before A: both were in the running
    batch at once. The runtime's own high-water mark of concurrently generating requests
    confirms it (no timing thresholds)."""
    url = default_server.cfg.grpc_url
    events: queue.Queue = queue.Queue()

    def run(name, text, max_tokens, end_id):
        try:
            for c in stream_generate(url, text, max_tokens, timeout_s=120, end_id=end_id):
                if c.num_tokens:
                    events.put((name, "token"))
            events.put((name, "done"))
        except Exception as exc:  # surfaced through the queue
            events.put((name, f"error {exc}"))

    a = threading.Thread(target=run, args=("A", _chat(built_default, "Tell me a long story."), 200, UNUSED_TOKEN))
    a.start()
    assert events.get(timeout=120) == ("A", "token")
    b = threading.Thread(target=run, args=("B", _chat(built_default, "Say hi."), 8, None))
    b.start()
    order = []
    while len([e for e in order if e[1] != "token"]) < 2:
        order.append(events.get(timeout=300))
    a.join(60)
    b.join(60)
    finals = [e for e in order if e[1] != "token"]
    assert finals[0] == ("B", "done"), order[-5:]
    assert ("A", "done") in finals
    assert ("B", "token") in order
    assert _metric(default_server, "max_concurrent_generating") >= 2


@pytest.mark.parametrize("case", ["empty_prompt", "max_tokens_zero", "max_tokens_above_limit", "prompt_too_long"])
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(default_server, built_default, case):
    prompt, max_tokens, expect = {
        "empty_prompt": ("", 16, "empty"),
        "max_tokens_zero": ("Hello", 0, "max_tokens"),
        "max_tokens_above_limit": ("Hello", 5000, "max_seq_len"),
        "prompt_too_long": ("word " * 1500, 8, "max_input_len"),
    }[case]
    with pytest.raises(RequestFailed) as err:
        _collect(default_server, prompt, max_tokens)
    assert expect in str(err.value), str(err.value)
    chunks = _collect(default_server, _chat(built_default, "What is the capital of France?"), 16)
    assert "Paris" in "".join(c.text for c in chunks)


def test_perf_metrics_are_ordered(default_server, built_default):
    chunks = _collect(default_server, _chat(built_default, "Name a color."), 8, perf_metrics=True)
    perf = [c.perf for c in chunks if c.perf]
    assert perf, "no perf metrics returned"
    last = perf[-1]
    assert last["arrival_time_ns"] <= last["first_scheduled_time_ns"] <= last["first_token_time_ns"] \
        <= last["last_token_time_ns"]


def test_serves_the_unified_checkpoint_with_the_tokens_transformers_gives(default_server, built_default):
    """One artifact for CPU dev and GPU prod: the portable runtime serves ModelOpt's unified HF checkpoint (the one
    trtllm-llmapi loads on a GPU host), dequantized, and its greedy answers through tritonserver are the tokens
    transformers itself decodes greedily from that dequantized checkpoint."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = built_default / "engine"
    assert json.loads((engine / "engine.json").read_text())["checkpoint_format"] == "hf_unified"
    assert (built_default / "checkpoint" / "hf_quant_config.json").is_file()  # ModelOpt's unified export
    tok = AutoTokenizer.from_pretrained(engine)
    model = AutoModelForCausalLM.from_pretrained(engine, dtype=torch.float32).eval()
    for question in ("What is the capital of France?", "Who wrote Hamlet?", "List three prime numbers."):
        prompt = _chat(built_default, question)
        served = "".join(c.text for c in _collect(default_server, prompt, 24))
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
        assert served == tok.decode(out, skip_special_tokens=True), question
