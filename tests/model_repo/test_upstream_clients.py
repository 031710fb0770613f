"""The calls upstream's own clients make, against the real tritonserver serving the default build.

TensorRT-LLM's triton_backend client scripts (end_to_end_grpc_client.py, inflight_batcher_llm_client.py,
end_to_end_test.py, benchmark_core_model.py) are what users point at a Triton TensorRT-LLM repository
first. What they send (tensor names, dtypes, shapes, default values) and how they read the answer
(text_output[0].decode(), output_ids[0][0], value[0][0]) is recorded in
tests/facts/trtllm_1_2_1/clients.json; each test here sends those tensors with tritonclient and reads
the responses the way the script does. The portable runtime answers through decoupled responses only,
so the scripts' unary calls to `tensorrt_llm` are out of reach by design (README, "Interface").
"""

from __future__ import annotations

import json
import queue
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

CLIENTS = json.loads((Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "clients.json")
                     .read_text())["clients"]
E2E = CLIENTS["end_to_end_grpc_client.py"]
IFB = CLIENTS["inflight_batcher_llm_client.py"]
PROMPT = "The only thing we have to fear is"
DTYPES = {"object (BYTES)": (object, "BYTES"), "object": (object, "BYTES"), "int32": (np.int32, "INT32"),
          "bool": (bool, "BOOL"), "float32": (np.float32, "FP32"), "uint64": (np.uint64, "UINT64")}


def _tensor(name, value, dtype):
    import tritonclient.grpc as grpcclient

    np_dtype, triton = DTYPES[dtype]
    arr = np.array(value, dtype=np_dtype)
    if np_dtype is object:
        arr = np.vectorize(lambda s: s.encode() if isinstance(s, str) else s, otypes=[object])(arr)
    t = grpcclient.InferInput(name, list(arr.shape), triton)
    t.set_data_from_numpy(arr)
    return t


def _e2e_inputs(prompt: str, streaming: bool, output_len: int, **options) -> list:
    """end_to_end_grpc_client.py's tensors: its default invocation (clients.json), then the options given."""
    defaults = {"text_input": [[prompt]], "max_tokens": [[output_len]], "stream": [[streaming]],
                "beam_width": [[E2E["argparse_defaults"]["beam_width (-b)"]]],
                "temperature": [[E2E["argparse_defaults"]["temperature"]]],
                "exclude_input_in_output": [[E2E["argparse_defaults"]["exclude_input_in_output"]]]}
    specs = {i["name"]: i["dtype"] for i in E2E["inputs_default_invocation"] + E2E["inputs_optional"]}
    assert set(defaults) == {i["name"] for i in E2E["inputs_default_invocation"]}
    return [_tensor(name, value, specs[name]) for name, value in {**defaults, **options}.items()]


def _stream(url, model, inputs, outputs=(), request_id="", extra_requests=()):
    """Send ``inputs`` (and then each of ``extra_requests``, (delay_s, inputs)) on one gRPC stream as the
    scripts do; return (results, errors) until the first request's final response."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    requested = [grpcclient.InferRequestedOutput(n) for n in outputs] or None
    client.async_stream_infer(model, inputs, request_id=request_id or uuid.uuid4().hex, outputs=requested,
                              enable_empty_final_response=True)
    results, errors, pending = [], [], list(extra_requests)
    finals_wanted = 1 + len(pending)
    deadline = time.monotonic() + 240
    while finals_wanted and time.monotonic() < deadline:
        if pending and results and time.monotonic() >= pending[0][0] + results[0][1]:
            _, more = pending.pop(0)
            client.async_stream_infer(model, more, request_id=request_id, enable_empty_final_response=True)
        try:
            result, error = got.get(timeout=0.05)
        except queue.Empty:
            continue
        if error is not None:
            errors.append(str(error))
            finals_wanted -= 1
            continue
        results.append((result, time.monotonic()))
        if result.get_response().parameters["triton_final_response"].bool_param:
            finals_wanted -= 1
    client.stop_stream()
    client.close()
    return [r for r, _ in results if r.get_response().outputs], errors


def _text(result) -> str:
    """How end_to_end_grpc_client.py reads a response (clients.json output_reading.text_output)."""
    return result.as_numpy("text_output")[0].decode("utf-8")


@pytest.fixture(scope="module")
def url(default_server):
    return default_server.cfg.grpc_url


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_end_to_end_grpc_client_reads_text_and_the_prompt_rule_holds(url, model):
    """Non-streaming with exclude_input_in_output false: text_output is prompt + answer (--check-outputs
    prepends the prompt); streamed: deltas only, which add up to that answer. Greedy by default although
    the script sends temperature 1.0 (TensorRT-LLM's rule), so two runs agree, as upstream CI expects."""
    whole, errors = _stream(url, model, _e2e_inputs(PROMPT, False, 10), ["text_output"])
    assert not errors and len(whole) == 1
    text = _text(whole[0])
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    streamed, errors = _stream(url, model, _e2e_inputs(PROMPT, True, 10), ["text_output"])
    assert not errors and len(streamed) > 1
    deltas = "".join(_text(r) for r in streamed)
    assert PROMPT not in deltas and PROMPT + deltas == text
    assert _text(_stream(url, model, _e2e_inputs(PROMPT, False, 10), ["text_output"])[0][0]) == text


def test_end_to_end_grpc_client_options(url, default_server):
    base = _text(_stream(url, "ensemble", _e2e_inputs(PROMPT, False, 12), ["text_output"])[0][0])[len(PROMPT):]
    words = base.split()
    # --stop-words / --bad-words / --embedding-bias-words+weights / --end-id
    stopped = _text(_stream(url, "ensemble", _e2e_inputs(PROMPT, False, 12, stop_words=[[" " + words[1]]]),
                            ["text_output"])[0][0])[len(PROMPT):]
    assert stopped.split() == words[:2]
    banned = _text(_stream(url, "ensemble", _e2e_inputs(PROMPT, False, 12, bad_words=[[" " + words[0]]]),
                           ["text_output"])[0][0])[len(PROMPT):]
    assert banned.split()[0] != words[0]
    biased = _text(_stream(url, "ensemble", _e2e_inputs(PROMPT, False, 12, embedding_bias_words=[[" " + words[0]]],
                                                        embedding_bias_weights=[[-100.0]]),
                           ["text_output"])[0][0])[len(PROMPT):]
    assert biased.split()[0] != words[0]
    # -n 2 (sampling needs top_p or top_k: this client sends only temperature, so add top_p as --top-p would)
    results, errors = _stream(url, "ensemble", _e2e_inputs(PROMPT, False, 8, num_return_sequences=[[2]]) +
                              [_tensor("top_p", [[1.0]], "float32"), _tensor("seed", [[3]], "uint64")],
                              ["text_output", "sequence_index"])
    assert not errors and sorted(int(r.as_numpy("sequence_index")[0][0]) for r in results) == [0, 1]
    # --return-log-probs, --return-perf-metrics, --return-generation-logits: read as the script reads them
    perf = E2E["requested_outputs"]["--return-perf-metrics"]
    results, errors = _stream(url, "ensemble", _e2e_inputs(PROMPT, False, 4, return_log_probs=[[True]],
                                                           return_perf_metrics=[[True]],
                                                           return_generation_logits=[[True]]),
                              ["text_output", "cum_log_probs", "output_log_probs", "generation_logits", *perf])
    assert not errors
    r = results[-1]
    assert r.as_numpy("output_log_probs").shape[-1] == 4 and r.as_numpy("cum_log_probs").size == 1
    assert r.as_numpy("generation_logits").shape[-2:] == (4, 49152)
    values = {name: r.as_numpy(name)[0][0] for name in perf}  # value[0][0]: 2-D, as the script indexes
    assert values["kv_cache_alloc_new_blocks"] >= 1 and values["first_token_time_ns"] >= values["arrival_time_ns"]
    assert r.as_numpy("kv_cache_alloc_total_blocks").dtype == np.int32 and \
        r.as_numpy("acceptance_rate").dtype == np.float32
    # --return-context-logits: refused for this request only, with the reason
    _, errors = _stream(url, "ensemble", _e2e_inputs(PROMPT, False, 4, return_context_logits=[[True]]),
                        ["text_output", "context_logits"])
    assert errors and "return_context_logits" in errors[0]


def test_end_to_end_grpc_client_batch_inputs(url):
    """--batch-inputs: two prompts in one request ([2, 1] tensors); each response names its prompt in
    batch_index (read as [0][0]) and each prompt gets the answer it gets alone."""
    prompts = [PROMPT, "The capital of France is"]
    alone = [_text(_stream(url, "ensemble", _e2e_inputs(p, False, 8), ["text_output"])[0][0]) for p in prompts]
    inputs = [_tensor("text_input", [[p] for p in prompts], "object (BYTES)"),
              _tensor("max_tokens", [[8], [8]], "int32"), _tensor("stream", [[False], [False]], "bool"),
              _tensor("beam_width", [[1], [1]], "int32"), _tensor("temperature", [[1.0], [1.0]], "float32"),
              _tensor("exclude_input_in_output", [[False], [False]], "bool")]
    results, errors = _stream(url, "ensemble", inputs, ["text_output", "batch_index"])
    assert not errors
    got = {int(r.as_numpy("batch_index")[0][0]): _text(r) for r in results}
    assert got == {0: alone[0], 1: alone[1]}


def _ifb_inputs(tokenizer, text, output_len, streaming, **options):
    """inflight_batcher_llm_client.py's tensors to `tensorrt_llm` (clients.json inputs_default_invocation)."""
    d = IFB["argparse_defaults"]
    ids = tokenizer.encode(text)
    values = {"input_ids": [ids], "input_lengths": [[len(ids)]], "request_output_len": [[output_len]],
              "beam_width": [[d["beam_width"]]], "temperature": [[d["temperature"]]], "streaming": [[streaming]],
              "end_id": [[tokenizer.eos_token_id]], "pad_id": [[tokenizer.pad_token_id]],
              "runtime_top_k": [[d["top_k"]]], "runtime_top_p": [[d["top_p"]]]}
    specs = {i["name"]: i["dtype"] for i in IFB["inputs_default_invocation"] + IFB["inputs_optional"]}
    assert set(values) == {i["name"] for i in IFB["inputs_default_invocation"]}
    return [_tensor(n, v, specs[n]) for n, v in {**values, **options}.items()], ids


@pytest.fixture(scope="module")
def tokenizer(built_default):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(built_default / "engine"))


def test_inflight_batcher_llm_client_streaming_and_n(url, tokenizer):
    """Streamed responses carry new tokens only (the client seeds the prompt itself); with -n 2 and no
    --exclude-input-in-output the non-streaming answers lead with the prompt, which the client strips."""
    inputs, ids = _ifb_inputs(tokenizer, IFB["argparse_defaults"]["text"], 16, True)
    results, errors = _stream(url, "tensorrt_llm", inputs)
    assert not errors
    streamed = [t for r in results for t in r.as_numpy("output_ids")[0][0].tolist()]
    assert 0 < len(streamed) <= 16 and streamed[:len(ids)] != ids
    inputs, ids = _ifb_inputs(tokenizer, IFB["argparse_defaults"]["text"], 6, False, num_return_sequences=[[2]],
                              runtime_top_k=[[40]])
    results, errors = _stream(url, "tensorrt_llm", inputs)
    assert not errors and len(results) == 2
    for r in results:
        seq = r.as_numpy("output_ids")[0][0][:r.as_numpy("sequence_length")[0][0]].tolist()
        assert seq[:len(ids)] == ids and len(seq) - len(ids) == 6  # the generated part is what follows


def test_inflight_batcher_llm_client_stop_request_ends_it_normally(url, tokenizer):
    """--stop-after-ms: a `stop` request with the same request id (clients.json stop_request) ends the running
    request normally, shorter than asked, with no error on either."""
    inputs, _ = _ifb_inputs(tokenizer, IFB["argparse_defaults"]["text"], 400, True, end_id=[[49151]])
    stop = [_tensor(t["name"], np.zeros((1, 1)).astype(DTYPES[t["dtype"]][0]) if t["name"] != "stop" else [[True]],
                    t["dtype"]) for t in IFB["stop_request"]["tensors"]]
    results, errors = _stream(url, "tensorrt_llm", inputs, request_id="77", extra_requests=[(1.0, stop)])
    assert not errors, errors
    generated = sum(r.as_numpy("output_ids")[0][0].size for r in results if r.as_numpy("output_ids") is not None)
    assert 0 < generated < 400


def test_end_to_end_test_preprocessing_and_postprocessing_steps(default_server, tokenizer):
    """end_to_end_test.py calls preprocessing and postprocessing with unary requests over HTTP and reads
    DECODER_INPUT_ID among the outputs (it failed on its absence)."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(default_server.cfg.http_url)

    def http(name, value, dtype):
        np_dtype, triton = DTYPES[dtype]
        arr = np.array(value, dtype=np_dtype)
        t = httpclient.InferInput(name, list(arr.shape), triton)
        t.set_data_from_numpy(arr)
        return t

    pre = client.infer("preprocessing", [http("QUERY", [[PROMPT.encode()]], "object"),
                                         http("BAD_WORDS_DICT", [[b""]], "object"),
                                         http("STOP_WORDS_DICT", [[b""]], "object"),
                                         http("REQUEST_OUTPUT_LEN", [[8]], "int32")])
    ids = pre.as_numpy("INPUT_ID")
    assert ids[0].tolist() == tokenizer.encode(PROMPT) and pre.as_numpy("REQUEST_INPUT_LEN")[0][0] == ids.shape[1]
    assert pre.as_numpy("DECODER_INPUT_ID") is not None and pre.as_numpy("OUT_END_ID") is not None
    tokens = np.array([[ids[0].tolist()]], dtype=np.int32)
    post = client.infer("postprocessing", [http("TOKENS_BATCH", tokens, "int32"),
                                           http("SEQUENCE_LENGTH", [[tokens.shape[-1]]], "int32")])
    assert post.as_numpy("OUTPUT")[0].decode() == PROMPT
    client.close()


def test_benchmark_core_model_decoupled_reads_the_output_length_from_the_first_output(url, tokenizer):
    """benchmark_core_model.py --decoupled: no streaming flag, no requested outputs; the output length is
    outputs[0].shape[2] (output_ids [batch, beam, tokens]), the prompt subtracted without its flag."""
    ids = tokenizer.encode(PROMPT)
    inputs = [_tensor("input_ids", [ids], "int32"), _tensor("input_lengths", [[len(ids)]], "int32"),
              _tensor("request_output_len", [[10]], "int32"), _tensor("pad_id", [[tokenizer.pad_token_id]], "int32"),
              _tensor("end_id", [[49151]], "int32")]
    results, errors = _stream(url, "tensorrt_llm", inputs)
    assert not errors and len(results) == 1
    first = results[0].get_response().outputs[0]
    assert first.name == "output_ids" and int(first.shape[2]) - len(ids) == 10


def _counter(server, kind):
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.cfg.metrics_port}/metrics", timeout=10).read().decode()
    line = next(x for x in body.splitlines() if x.startswith("trtpipe_runtime_total{") and f'kind="{kind}"' in x)
    return float(line.rsplit(" ", 1)[1])


def _settled(server, kind):
    last = None
    for _ in range(60):
        now = _counter(server, kind)
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError(f"{kind} still moving")


@pytest.mark.parametrize("streaming", [False, True])
def test_token_counter_counts_each_generated_token_once(default_server, url, streaming):
    """trtpipe_runtime_total{kind="tokens"} counted a non-streaming answer of n tokens as n(n+1)/2."""
    before = _settled(default_server, "tokens")
    # a plain continuation prompt with end_id 49151 (never produced): it runs to max_tokens
    results, errors = _stream(url, "ensemble", _e2e_inputs(PROMPT, streaming, 10) +
                              [_tensor("end_id", [[49151]], "int32")], ["text_output", "num_output_tokens"])
    assert not errors
    time.sleep(0.3)
    assert _settled(default_server, "tokens") - before == 10
