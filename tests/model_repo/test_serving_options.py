"""The repository generated from this checkout's templates, served by the real tritonserver.

One server for the module, on a repository generated into a temporary folder from the built
SmolLM2 engine (so template changes are what is tested, not the repository of an earlier build):
every model loads (ensemble and tensorrt_llm_bls), each decoding option changes the output the
way it should, a cancelled stream gives its KV blocks back, and the server keeps serving.
"""

from __future__ import annotations

import os
import queue
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from pipeline.client import RequestFailed, build_inputs, format_chat, stream_generate

pytestmark = pytest.mark.e2e

UNUSED_TOKEN = 49151  # never emitted for these prompts: generation runs to max_tokens


@pytest.fixture(scope="module")
def engine_dir(request) -> Path:
    """The built engine folder: an existing build under TRTPIPE_TEST_BUILD_ROOT is used as it is
    (no stage is re-run, so another checkout's build folder is never rewritten); else the default build."""
    from builders.layout import build_dir
    from builders.spec import load_spec
    from tests.conftest import DEFAULT_BUILD

    root = os.environ.get("TRTPIPE_TEST_BUILD_ROOT")
    if root:
        eng = build_dir(load_spec(DEFAULT_BUILD, "cpu"), Path(root)) / "engine"
        if (eng / "engine.json").is_file():
            return eng
    return request.getfixturevalue("built_default") / "engine"


def _start_server(engine_dir, tmp, server_args=(), **llm_params):
    from model_repo.generate import default_sys_path, plan_repository, write_repository
    from pipeline.serve import ServerConfig, TritonServer, free_ports
    from builders.spec import load_spec
    from plugins.targets import get_target
    from tests.conftest import DEFAULT_BUILD

    tmp.mkdir(parents=True, exist_ok=True)
    plan = plan_repository(load_spec(DEFAULT_BUILD, "cpu"), get_target("cpu"), None, engine_dir)
    llm = next(m for m in plan.models if m.name == "tensorrt_llm")
    for key, value in llm_params.items():
        llm.set(key, value, "test")
    write_repository(plan, tmp / "model_repo")
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(model_repository=tmp / "model_repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                       log_file=tmp / "tritonserver.log", ready_timeout_s=300, python_path=default_sys_path(),
                       extra_args=list(server_args))
    return TritonServer(cfg).start()


@pytest.fixture(scope="module")
def server(engine_dir, tmp_path_factory):
    srv = _start_server(engine_dir, tmp_path_factory.mktemp("repo"), max_queue_size=64)  # QUEUED wait: none refused
    yield srv
    # After every test here, cancelled BLS and direct streams included, the server stops cleanly: a BLS model
    # that left its inner stream unread would never unload (the server then gives up after its exit timeout).
    # And the engine worker ends with its server.
    import psutil

    workers = _engine_workers(srv)
    result = srv.stop()
    assert not result["forced"], f"the server needed force to stop: {result}"
    assert workers and not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


def _chat(engine_dir, text):
    return format_chat(engine_dir, text)


def _text(server, prompt, max_tokens, **kw):
    chunks = list(stream_generate(server.cfg.grpc_url, prompt, max_tokens, timeout_s=120, **kw))
    return "".join(c.text for c in chunks), sum(c.num_tokens for c in chunks), chunks


def _metric(server, family: str, state: str, label: str = "state") -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.cfg.metrics_port}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(family + "{") and f'{label}="{state}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{family} {label}={state} not exported")


def _direct_inputs(engine_dir, text: str, max_tokens: int):
    """The tensorrt_llm model's own tensors (what preprocessing would send), tokenized here."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from transformers import AutoTokenizer

    ids = np.array([AutoTokenizer.from_pretrained(str(engine_dir)).encode(text)], dtype=np.int32)
    inputs = []
    for name, arr, dtype in (("input_ids", ids, "INT32"), ("input_lengths", np.array([[ids.shape[1]]], np.int32), "INT32"),
                             ("request_output_len", np.array([[max_tokens]], np.int32), "INT32"),
                             ("streaming", np.array([[True]]), "BOOL"),
                             ("end_id", np.array([[UNUSED_TOKEN]], np.int32), "INT32")):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    return inputs


def test_every_model_loads_and_bls_streams_the_same_answer(server, engine_dir):
    prompt = _chat(engine_dir, "What is the capital of France?")
    ens, _, _ = _text(server, prompt, 24)
    bls, _, chunks = _text(server, prompt, 24, model="tensorrt_llm_bls")
    assert "Paris" in ens and bls == ens
    assert len([c for c in chunks if c.num_tokens]) > 1, "BLS did not stream"


def test_greedy_equals_top_k_1_and_temperature_0(server, engine_dir):
    prompt = _chat(engine_dir, "Name three fruits.")
    greedy, _, _ = _text(server, prompt, 16)
    assert _text(server, prompt, 16, extra={"top_k": 1, "temperature": 0.9, "seed": 7})[0] == greedy
    assert _text(server, prompt, 16, extra={"temperature": 0.0})[0] == greedy
    # temperature alone is greedy, as in TensorRT-LLM (top_k 0 and top_p 0, the defaults, mean greedy)
    assert _text(server, prompt, 16, extra={"temperature": 1.5, "seed": 9})[0] == greedy


def test_seed_makes_sampling_reproducible_and_seeds_differ(server, engine_dir):
    prompt = _chat(engine_dir, "Write a sentence about the sea.")
    opts = {"temperature": 1.3, "top_p": 0.95}
    a = _text(server, prompt, 20, extra={**opts, "seed": 1})[0]
    assert _text(server, prompt, 20, extra={**opts, "seed": 1})[0] == a
    assert _text(server, prompt, 20, extra={**opts, "seed": 2})[0] != a


def test_min_tokens_makes_the_answer_at_least_that_long(server, engine_dir):
    prompt = _chat(engine_dir, "Say hi.")
    _, n_plain, _ = _text(server, prompt, 32)
    assert n_plain < 24, "the baseline must stop early for this test to mean anything"
    _, n, _ = _text(server, prompt, 32, extra={"min_tokens": 24})
    assert n >= 24


def test_repetition_penalty_reduces_repeats(server, engine_dir):
    prompt = _chat(engine_dir, "Repeat the word 'cat' fifty times.")
    plain, _, _ = _text(server, prompt, 32, end_id=UNUSED_TOKEN)
    penalised, _, _ = _text(server, prompt, 32, end_id=UNUSED_TOKEN, extra={"repetition_penalty": 1.8})

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(engine_dir)

    def distinct(text):  # share of distinct tokens: repeated words and repeated newlines both count
        ids = tok.encode(text, add_special_tokens=False)
        return len(set(ids)) / max(1, len(ids))

    assert distinct(penalised) > distinct(plain), (plain, penalised)


def test_log_probs_sequences_and_exclude_input(server, engine_dir):
    prompt = _chat(engine_dir, "What is the capital of France?")
    _, _, chunks = _text(server, prompt, 8, extra={"return_log_probs": True},
                         extra_outputs=("output_log_probs", "cum_log_probs"))
    lps = [float(x) for c in chunks if c.outputs and "output_log_probs" in c.outputs
           for x in c.outputs["output_log_probs"].reshape(-1)]
    assert lps and all(lp <= 0 for lp in lps)
    _, _, chunks = _text(server, prompt, 8, extra={"num_return_sequences": 2, "temperature": 1.0, "top_p": 1.0,
                                                   "seed": 3},
                         extra_outputs=("sequence_index",))
    assert {int(c.outputs["sequence_index"].reshape(-1)[0]) for c in chunks if c.outputs} == {0, 1}
    # upstream's rule: a streamed answer never repeats the prompt; a non-streaming one leads with it unless
    # the request sends exclude_input_in_output true (the backend's default is false)
    streamed, n_streamed, _ = _text(server, prompt, 8, extra={"exclude_input_in_output": False})
    assert "What is the capital of France?" not in streamed and "Paris" in streamed
    whole, n_whole, chunks = _text(server, prompt, 8, stream=False)
    assert len([c for c in chunks if c.num_tokens]) == 1
    assert whole.startswith("system") and "What is the capital of France?" in whole and whole.endswith(streamed)
    assert n_whole > n_streamed  # sequence_length counts the prompt as well, as upstream's does
    assert _text(server, prompt, 8, stream=False, extra={"exclude_input_in_output": True})[0] == streamed


def test_unsupported_options_are_refused_per_request(server, engine_dir):
    for extra, expect in (({"beam_width": 2}, "beam"), ({"temperature": -1.0}, "temperature"),
                          ({"num_return_sequences": 2}, "identical")):
        with pytest.raises(RequestFailed, match=expect):
            _text(server, "Hello", 4, extra=extra)
    assert "Paris" in _text(server, _chat(engine_dir, "What is the capital of France?"), 16)[0]


def test_perf_metrics_report_kv_blocks(server, engine_dir):
    _, _, chunks = _text(server, _chat(engine_dir, "Name a color."), 8, perf_metrics=True)
    last = [c.perf for c in chunks if c.perf][-1]
    assert last["kv_cache_alloc_new_blocks"] >= 1 and last["kv_cache_reused_blocks"] == 0


def _direct_stream(server, engine_dir, text, max_tokens):
    """Stream one request to tensorrt_llm itself: the token ids of every response, in order."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.cfg.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("tensorrt_llm", _direct_inputs(engine_dir, text, max_tokens),
                              request_id=uuid.uuid4().hex, enable_empty_final_response=True)
    responses = []
    while True:
        result, error = got.get(timeout=120)
        assert error is None, error
        ids = result.as_numpy("output_ids")
        if ids is not None:
            responses.append(ids.reshape(-1).tolist())
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return responses


def _counter(server, kind):
    return _metric(server, "trtpipe_runtime_total", kind, label="kind")


def _wait_published(server, kind, at_least, timeout_s=10.0):
    """Counters are published every cancellation_check_period_ms: wait until ``kind`` reaches ``at_least``."""
    deadline = time.monotonic() + timeout_s
    while _counter(server, kind) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return _counter(server, kind)


def _settled(server, kinds):
    """The counters once the earlier tests' last responses are published (two equal reads 0.3 s apart)."""
    last = None
    for _ in range(50):
        now = {k: _counter(server, k) for k in kinds}
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError(f"counters still moving: {now}")


def test_response_counters_count_what_the_client_receives(server, engine_dir):
    before = _settled(server, ("responses", "tokens", "steps"))
    send_before = _metric(server, "trtpipe_runtime_response_seconds_total", "send", label="stage")
    responses = _direct_stream(server, engine_dir, _chat(engine_dir, "Count to ten."), 12)
    tokens = sum(len(r) for r in responses)
    assert tokens == 12 and len(responses) > 1
    assert _wait_published(server, "responses", before["responses"] + len(responses)) == \
        before["responses"] + len(responses)
    assert _counter(server, "tokens") == before["tokens"] + tokens
    assert before["steps"] < _counter(server, "steps") <= before["steps"] + len(responses)
    assert _metric(server, "trtpipe_runtime_response_seconds_total", "send", label="stage") > send_before


# Not the ensemble: Triton (core PR #263; measured with 2.51) checks an ensemble's cancellation only
# between steps and hands it to the *next* step, never to the tensorrt_llm step already streaming; there
# the request runs on to max_tokens (docs/deploy.md, "Cancelling"). BLS forwards it; a direct
# request to tensorrt_llm is cancelled by Triton's gRPC frontend itself.
@pytest.mark.parametrize("model", ["tensorrt_llm_bls", "tensorrt_llm"])
def test_cancelled_stream_frees_its_kv_blocks_and_server_keeps_serving(server, engine_dir, model):
    _check_cancel_frees_blocks(server, engine_dir, model)


def _check_cancel_frees_blocks(server, engine_dir, model):
    import tritonclient.grpc as grpcclient

    total = _metric(server, "trtpipe_runtime_kv_cache_blocks", "total")
    cancelled_before = _metric(server, "trtpipe_runtime_total", "cancelled", label="kind")
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.cfg.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    text = _chat(engine_dir, "Tell me a long story.")
    inputs = (build_inputs(text, 2000, end_id=UNUSED_TOKEN) if model != "tensorrt_llm"
              else _direct_inputs(engine_dir, text, 2000))
    client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True)
    for _ in range(5):
        result, error = got.get(timeout=120)
        assert error is None, error
    deadline = time.monotonic() + 10
    while _metric(server, "trtpipe_runtime_kv_cache_blocks", "free") >= total and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(server, "trtpipe_runtime_kv_cache_blocks", "free") < total, "the request holds no blocks"
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 60  # generous: a loaded CI machine delivers tokens slowly
    while time.monotonic() < deadline:
        if (_metric(server, "trtpipe_runtime_kv_cache_blocks", "free") == total
                and _metric(server, "trtpipe_runtime_requests", "inflight") == 0):
            break
        time.sleep(0.2)
    assert _metric(server, "trtpipe_runtime_kv_cache_blocks", "free") == total, "blocks not given back"
    assert _metric(server, "trtpipe_runtime_requests", "inflight") == 0
    # freed by the cancellation, not by running to the end (2000 tokens take minutes on CPU)
    assert _metric(server, "trtpipe_runtime_total", "cancelled", label="kind") == cancelled_before + 1
    assert "Paris" in _text(server, _chat(engine_dir, "What is the capital of France?"), 16)[0]


def _wait_metric(server, family, state, want, timeout_s=60.0, label="state"):
    """Poll a gauge or counter until it equals ``want`` (published every cancellation_check_period_ms)."""
    deadline = time.monotonic() + timeout_s
    while _metric(server, family, state, label) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return _metric(server, family, state, label)


QUEUED = 36
"""Requests cancelled while queued: more than the 32 threads Triton's Python backend runs BLS calls on (a BLS
exec() holds one until its first response; with all of them held, the BLS's `stop` requests waited too)."""


@pytest.mark.parametrize("model", ["tensorrt_llm_bls", "tensorrt_llm"])
def test_a_request_cancelled_while_queued_leaves_the_queue_at_once(server, engine_dir, model):
    """max_batch_size (8) long streams generate; QUEUED more wait (in the runtime's queue, or in the BLS's own
    wait for a pending slot) and are cancelled there: they leave within seconds (not when a slot frees) while
    the 8 keep generating; then the 8 are cancelled too and every KV block comes back. Each request on its own
    gRPC stream, as separate clients are."""
    import tritonclient.grpc as grpcclient

    total = _metric(server, "trtpipe_runtime_kv_cache_blocks", "total")
    assert _wait_metric(server, "trtpipe_runtime_requests", "inflight", 0) == 0, "earlier requests still in flight"
    cancelled0 = _counter(server, "cancelled")
    text = _chat(engine_dir, "Tell me a long story.")
    clients = []

    def start(n):
        for _ in range(n):
            client = grpcclient.InferenceServerClient(server.cfg.grpc_url)
            client.start_stream(callback=lambda result, error: None)
            inputs = (build_inputs(text, 1900, end_id=UNUSED_TOKEN) if model != "tensorrt_llm"
                      else _direct_inputs(engine_dir, text, 1900))
            client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex)
            clients.append(client)

    try:
        start(8)
        assert _wait_metric(server, "trtpipe_runtime_requests", "generating", 8, timeout_s=120) == 8
        start(QUEUED)
        queued = _wait_steady(server, "trtpipe_runtime_requests", "queued")
        assert queued >= 16, f"only {queued} of {QUEUED} requests reached the queue"
        for client in reversed(clients[8:]):  # the last ones first: those still waiting in the BLS never start
            client.stop_stream(cancel_requests=True)
        assert _wait_metric(server, "trtpipe_runtime_requests", "queued", 0, timeout_s=15) == 0, \
            "cancelled requests stayed in the queue"
        assert _metric(server, "trtpipe_runtime_requests", "generating") == 8, "the running batch was disturbed"
        assert _wait_published_total(server, cancelled0 + queued) == cancelled0 + queued
        for client in clients[:8]:
            client.stop_stream(cancel_requests=True)
        assert _wait_metric(server, "trtpipe_runtime_requests", "inflight", 0) == 0
        assert _wait_metric(server, "trtpipe_runtime_kv_cache_blocks", "free", total) == total, "blocks not given back"
        assert _wait_published_total(server, cancelled0 + queued + 8) == cancelled0 + queued + 8
    finally:
        for client in clients:  # a stream closed without cancel_requests waits for its requests to end
            client.stop_stream(cancel_requests=True)
            client.close()
    requests = _counter(server, "requests")
    assert "Paris" in _text(server, _chat(engine_dir, "What is the capital of France?"), 16, model=model
                            if model != "tensorrt_llm" else "ensemble")[0]
    # the answered request is counted in a later publication than every cancellation: no late double count by then
    assert _wait_published(server, "requests", requests + 1, timeout_s=30) >= requests + 1
    assert _counter(server, "cancelled") == cancelled0 + queued + 8, "a cancellation was counted twice, late"


def _wait_steady(server, family, state, steady_s=1.0, timeout_s=60.0):
    """The metric's value once it has not changed for ``steady_s`` (or at ``timeout_s``)."""
    value, since = _metric(server, family, state), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline and time.monotonic() - since < steady_s:
        time.sleep(0.1)
        now = _metric(server, family, state)
        if now != value:
            value, since = now, time.monotonic()
    return int(value)


def _wait_published_total(server, want, timeout_s=30.0):
    """The cancelled total once it reaches ``want`` (polled; published every cancellation_check_period_ms); an
    AssertionError naming both values when it does not within ``timeout_s``. A count above ``want`` is returned
    as it is (the caller's equality shows it); a late double count shows at the next call and at the test's end,
    once every request has ended."""
    deadline = time.monotonic() + timeout_s
    while (got := _counter(server, "cancelled")) < want:
        assert time.monotonic() < deadline, \
            f"trtpipe_runtime_total{{kind=\"cancelled\"}} is {got} after {timeout_s:.0f} s, want {want}"
        time.sleep(0.1)
    return got


def _log_probs(server, text):
    """The sampled tokens' log probs, then each one's 3 most likely (ids, values) and the prompt's log probs
    (num_top_logprobs, return_prompt_log_probs: one forward pass of the prompt where the model is, the engine
    worker or the stub)."""
    _, n, chunks = _text(server, text, 8, extra={"return_log_probs": True, "num_top_logprobs": 3,
                                                 "return_prompt_log_probs": True},
                         extra_outputs=("output_log_probs", "cum_log_probs", "top_token_ids", "top_log_probs",
                                        "prompt_log_probs"))
    got = {name: [float(x) for c in chunks if c.outputs and name in c.outputs for x in c.outputs[name].reshape(-1)]
           for name in ("output_log_probs", "top_token_ids", "top_log_probs", "prompt_log_probs")}
    lps = got["output_log_probs"]
    assert len(lps) == n > 0 and len(got["top_token_ids"]) == 3 * n and got["prompt_log_probs"]
    return lps, got["top_token_ids"] + got["top_log_probs"] + got["prompt_log_probs"]


def test_engine_process_serves_like_the_stub_loop_with_either_dispatch(server, engine_dir, tmp_path):
    """engine_process = true (the default: the generation loop in its own process, engine_worker.py) gives the
    same greedy tokens, seeded samples and log probs as the loop in a thread of the stub (engine_process false,
    its own servers) with response_dispatch thread and inline (the generation thread sends between steps; one
    response per step); KV-block perf outputs, and a cancelled stream gives its blocks back. (The worker ends
    with its server: the module fixture's teardown.)"""
    assert len(_engine_workers(server)) == 1, "one engine worker process under the tensorrt_llm stub"
    assert "response dispatch engine process" in server.log_path.read_text()
    text = _chat(engine_dir, "What is the capital of France?")
    opts = {"temperature": 1.3, "top_p": 0.95, "seed": 5}
    greedy = [t for r in _direct_stream(server, engine_dir, text, 16) for t in r]
    sampled = _text(server, text, 16, extra=opts)[0]
    lps, more = _log_probs(server, text)
    assert all(lp <= 0 for lp in lps)
    for dispatch in ("thread", "inline"):
        srv = _start_server(engine_dir, tmp_path / dispatch, engine_process="false", response_dispatch=dispatch)
        try:
            assert not _engine_workers(srv)
            # the mode the model says it runs (thread and inline both send one token per response when idle)
            assert f"response dispatch {dispatch}" in srv.log_path.read_text()
            got = _direct_stream(srv, engine_dir, text, 16)
            assert [t for r in got for t in r] == greedy
            if dispatch == "inline":
                assert all(len(r) == 1 for r in got), "inline dispatch sends each step's token in its own response"
                assert _wait_published(srv, "responses", len(got)) == len(got) == _counter(srv, "steps")
            else:
                assert _text(srv, text, 16, extra=opts)[0] == sampled
                got, got_more = _log_probs(srv, text)
                assert got == pytest.approx(lps, rel=1e-4, abs=1e-5)
                assert got_more == pytest.approx(more, rel=1e-4, abs=1e-5)
        finally:
            result = srv.stop()
        assert not result["forced"], result
    _, _, chunks = _text(server, _chat(engine_dir, "Name a color."), 8, perf_metrics=True)
    assert [c.perf for c in chunks if c.perf][-1]["kv_cache_alloc_new_blocks"] >= 1
    _check_cancel_frees_blocks(server, engine_dir, "tensorrt_llm")


def _engine_workers(server):
    """The engine worker processes under ``server``'s tritonserver."""
    import psutil

    return [p for p in psutil.Process(server.proc.pid).children(recursive=True)
            if "engine_worker.py" in " ".join(p.cmdline())]


def test_stop_ends_a_busy_server_and_its_stubs(engine_dir, tmp_path):
    """Its own server, with a 5 s exit timeout (30 s by default). With a stream still generating, tritonserver
    gives up unloading after its exit timeout and leaves its Python-backend stubs running (they ignore
    SIGTERM); stop must kill it and say it had to, and no stub may outlive it (each ends itself once tritonserver
    is gone, trtpipe_runtime.lifeline; stop kills any that has not)."""
    import psutil
    import tritonclient.grpc as grpcclient

    server = _start_server(engine_dir, tmp_path, server_args=["--exit-timeout-secs=5"])
    client = grpcclient.InferenceServerClient(server.cfg.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("ensemble", build_inputs(_chat(engine_dir, "Tell me a long story."), 2000,
                                                       end_id=UNUSED_TOKEN),
                              request_id=uuid.uuid4().hex, enable_empty_final_response=True)
    for _ in range(3):
        assert got.get(timeout=120)[1] is None
    stubs = psutil.Process(server.proc.pid).children(recursive=True)
    assert stubs, "no Python-backend stubs found under tritonserver"
    regions = [a for p in stubs for a in p.cmdline() if a.startswith("triton_python_backend_shm_region")]
    result = server.stop(timeout=10)  # the stream is still open and generating; past its exit timeout
    # tritonserver 2.51 logs "Exit timeout expired", then crashed in its exit and had not ended 35 s later: 10 s
    client.close()
    assert result["forced"] and result["wait_s"] >= 4, result
    assert not [p.pid for p in stubs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    # the stubs' shared-memory regions do not stay behind in /dev/shm (stop removes what no process removed)
    assert regions
    assert not [r for r in regions if (Path("/dev/shm") / r).exists()], regions
