"""Greedy answers through the server against the in-process runtime's, streamed and not (bench_h200.py --probes).

Three chat prompts (ASCII, CJK + emoji, accented), each with the build's chat template applied as the OpenAI
frontend applies it. Served (the `openai` phase, one request at a time, on the server `trtpipe serve` started):

  tensorrt_llm   gRPC straight to the runtime model: the prompt's ids in, ``output_ids`` out, streamed and not
  ensemble       gRPC text in / text out (preprocessing -> tensorrt_llm -> postprocessing), streamed and not
  bls            gRPC text in / text deltas out of tensorrt_llm_bls (what the OpenAI frontend calls), streamed;
                 bls_asked: the frontend's own inputs and its two outputs asked by name
  completions    the OpenAI frontend's /v1/completions (the tensorrt_llm_bls model), streamed and not
  chat           /v1/chat/completions with the user message alone (the frontend applies the template)

In-process (the `inproc` phase): the same ids through the runtime's own manager (engine_worker.build_manager, the
served settings), one request at a time, greedy, ending at the engine folder's end ids as the served model does.
``compare`` puts them side by side: ids must be equal; every text must be ``decode(in-process ids)`` (special
tokens skipped) less a last character the token budget cut in half (trtpipe_runtime/detokenize.py's rule);
"equal but U+FFFD": equal once U+FFFD is taken out of both (ids that decode to a lone partial character inside
the answer, as the random 8B-shaped model's do: a stream drops it, one decode of all ids keeps it).

    python scripts/bench/probes.py RESULTS_DIR   # the openai.json and inproc.json a run left under <work>/results
"""

from __future__ import annotations

import json
import queue
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

MAX_TOKENS = 32
TIMEOUT_S = 120.0
"""Per served request: a 32-token greedy answer takes well under a second on a warm server; a request that has no
final response by then is recorded as an error and the next one is sent (the session-8 lease stalled silently)."""
PROMPTS = (("ascii", "What is the capital of France? Answer in one sentence."),
           ("cjk", "東京で一番有名な食べ物は？ 🍣 请用中文回答。"),
           ("accented", "Écris une phrase sur la mer, s'il te plaît."))
REPLACEMENT = "\ufffd"
SERVED_KINDS = ("trt_stream", "trt_infer", "ensemble_stream", "ensemble_infer", "bls_stream", "bls_asked",
                "completions_stream", "completions_infer", "chat_stream", "chat_infer")


def prompts(tokenizer_dir: Path, add_special_tokens: bool) -> list[dict]:
    """name, user message, templated text and its ids (tokenized as the repository's preprocessing does)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for name, user in PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
        out.append({"name": name, "user": user, "text": text,
                    "ids": tok.encode(text, add_special_tokens=add_special_tokens)})
    return out


# ------------------------------------------------------------------------------------------------ served
def _grpc(url: str, model: str, inputs: dict, timeout_s: float = TIMEOUT_S, outputs: tuple[str, ...] = ()) -> list[dict]:
    """One request on a gRPC stream until its final response: the outputs of every response (``outputs``: only
    these requested, else all)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    finished = False
    try:
        tensors = []
        for name, value in inputs.items():
            arr = np.asarray(value)
            dtype = "BYTES" if arr.dtype == object else "BOOL" if arr.dtype == bool else "INT32"
            t = grpcclient.InferInput(name, list(arr.shape), dtype)
            t.set_data_from_numpy(arr.astype(np.int32) if dtype == "INT32" else arr)
            tensors.append(t)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, tensors, request_id=uuid.uuid4().hex, enable_empty_final_response=True,
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in outputs] or None)
        outs = []
        while True:
            try:
                result, error = got.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"{model}: no final response in {timeout_s:.0f} s ({len(outs)} responses)") from None
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            resp = result.get_response()
            o = {x.name: result.as_numpy(x.name) for x in resp.outputs}
            if o:
                outs.append(o)
            if resp.parameters["triton_final_response"].bool_param:
                finished = True
                return outs
    finally:
        # never cancel a finished request (tritonserver 2.51 crashed on it); an unfinished one is cancelled, else
        # stop_stream waits for its final response forever (session 9: a 120 s timeout became an 11-minute hang)
        client.stop_stream(cancel_requests=not finished)
        client.close()


def _text_inputs(text: str, max_tokens: int, stream: bool) -> dict:
    """The text-in models' inputs (ensemble, tensorrt_llm_bls): text_input, max_tokens, stream."""
    import numpy as np

    return {"text_input": np.array([[text.encode()]], dtype=object), "max_tokens": np.array([[max_tokens]]),
            "stream": np.array([[stream]])}


def _text(outs: list[dict]) -> str:
    """Every response's text_output, in order, as one string."""
    return "".join(x.decode() for o in outs if o.get("text_output") is not None
                   for x in o["text_output"].reshape(-1).tolist())


def _http(base: str, path: str, body: dict, timeout_s: float = TIMEOUT_S) -> str:
    """The answer's text from the OpenAI API: the JSON response, or the SSE stream's text deltas joined."""
    req = urllib.request.Request(base.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    chat = path.endswith("chat/completions")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except urllib.error.HTTPError as exc:  # the API's error body says why (session 9 kept only "500")
        raise RuntimeError(f"HTTP {exc.code}: {exc.read()[:1500].decode(errors='replace')}") from None
    with resp:
        if not body.get("stream"):
            choice = json.loads(resp.read())["choices"][0]
            return choice["message"]["content"] or "" if chat else choice["text"]
        parts = []
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            for choice in ev.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "" if chat else choice.get("text") or "")
        return "".join(parts)


def served_answers(grpc_url: str, openai_base: str | None, model_id: str, ps: list[dict],
                   max_tokens: int = MAX_TOKENS, on_answer=None) -> list[dict]:
    """Every served kind of answer for every prompt, one request at a time (errors kept as text); ``on_answer(rows)``
    after each request (the caller logs it and keeps what exists so far)."""
    import numpy as np

    rows, timeouts = [], 0
    for p in ps:
        if timeouts >= 2:  # two requests in a row without a final response: the server is stuck, not one request
            break
        row = {"name": p["name"], "ids": p["ids"]}
        ids = p["ids"]
        for stream in (True, False):
            suffix = "stream" if stream else "infer"
            calls = {
                f"trt_{suffix}": lambda: [int(x) for o in _grpc(grpc_url, "tensorrt_llm", {
                    "input_ids": np.array([ids]), "input_lengths": np.array([[len(ids)]]),
                    "request_output_len": np.array([[max_tokens]]), "streaming": np.array([[stream]])})
                    for x in o["output_ids"].reshape(-1).tolist()],
                f"ensemble_{suffix}": lambda: _text(_grpc(grpc_url, "ensemble", {
                    **_text_inputs(p["text"], max_tokens, stream), "exclude_input_in_output": np.array([[True]])})),
            }
            if stream:  # the model the OpenAI frontend calls, without the frontend (it always streams)
                calls["bls_stream"] = lambda: _text(_grpc(grpc_url, "tensorrt_llm_bls", {
                    **_text_inputs(p["text"], max_tokens, True), "exclude_input_in_output": np.array([[True]])}))
                # the OpenAI frontend's own request (pipeline.client.build_inputs, its two outputs asked by name)
                calls["bls_asked"] = lambda: _text(_grpc(grpc_url, "tensorrt_llm_bls",
                                                         _text_inputs(p["text"], max_tokens, True),
                                                         outputs=("text_output", "num_output_tokens")))
            if openai_base:
                common = {"model": model_id, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
                calls[f"completions_{suffix}"] = lambda: _http(openai_base, "/completions",
                                                               {**common, "prompt": p["text"]})
                calls[f"chat_{suffix}"] = lambda: _http(openai_base, "/chat/completions",
                                                        {**common, "messages": [{"role": "user",
                                                                                 "content": p["user"]}]})
            for kind, call in calls.items():
                t0 = time.perf_counter()
                try:
                    row[kind] = call()
                except Exception as exc:  # keep going: the report says which kind failed and how
                    row[kind] = None
                    row[f"{kind}_error"] = f"{type(exc).__name__}: {exc}"[:2000]
                    timeouts = timeouts + 1 if isinstance(exc, TimeoutError) or "timed out" in str(exc) else 0
                else:
                    timeouts = 0
                row[f"{kind}_s"] = time.perf_counter() - t0
                print(f"probe {p['name']} {kind}: {row[f'{kind}_s']:.2f} s"
                      + (f" ERROR {row[f'{kind}_error'][:300]}" if row[kind] is None else ""), flush=True)
                if on_answer is not None:
                    on_answer(rows + [row])
                if timeouts >= 2:
                    print("probes: two requests in a row had no final response; the rest are skipped", flush=True)
                    break
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ in-process
def inproc_answers(manager, table, sampling, default_end_ids, ps: list[dict], max_tokens: int = MAX_TOKENS) -> list[dict]:
    """Greedy ids of the in-process runtime for every prompt, one request at a time; end ids as the served model
    takes them when a request names none (sampling.request_end_ids), and dropped from the output as it drops them."""
    end_ids = list(sampling.request_end_ids(None, default_end_ids))
    rows = []
    for p in ps:
        rid = f"probe-{p['name']}-{time.monotonic_ns()}"
        handle = table.add(sampling.SamplingParams(end_ids=tuple(end_ids)))
        manager.add_request(list(p["ids"]), request_id=rid, max_new_tokens=max_tokens, streaming=True,
                            eos_token_id=end_ids if end_ids else -1, **{sampling.HANDLE_KWARG: handle})
        deadline, out = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            r = manager.get_result(timeout=1.0)
            if r is not None and r.request_id == rid and r.is_finished():
                out = [int(x) for x in r.generated_tokens]
                break
        if out is None:
            rows.append({"name": p["name"], "ids": p["ids"], "error": "no final result in 300 s"})
            continue
        cut = next((i for i, t in enumerate(out) if t in end_ids), len(out))
        rows.append({"name": p["name"], "ids": p["ids"], "output_ids": out[:cut], "raw_output_ids": out,
                     "end_ids": end_ids})
    return rows


# ------------------------------------------------------------------------------------------------ compare
def compare(served: list[dict], inproc: list[dict], tokenizer_dir: Path) -> dict:
    """Per prompt and served kind: equal to the in-process answer or not (ids; texts against its decode)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ref = {r["name"]: r for r in inproc}
    rows, ok = [], True
    for s in served:
        r = ref.get(s["name"])
        row = {"name": s["name"], "prompt_ids_equal": r is not None and r["ids"] == s["ids"]}
        if r is None or "output_ids" not in r:
            row["error"] = "no in-process answer"
            rows.append(row)
            ok = False
            continue
        want_ids = r["output_ids"]
        full = tok.decode(want_ids, skip_special_tokens=True)
        want = full.rstrip("\ufffd")
        row.update({"inproc_tokens": len(want_ids), "inproc_text": want,
                    "inproc_text_has_replacement": "\ufffd" in want})
        for kind in SERVED_KINDS:
            if kind not in s:
                continue
            got = s[kind]
            if got is None:
                row[kind] = "error: " + s.get(f"{kind}_error", "?")
            elif kind.startswith("trt_"):
                if kind == "trt_infer" and got[:len(s["ids"])] == s["ids"]:
                    got = got[len(s["ids"]):]  # one response: the prompt's ids, then the answer's (TensorRT-LLM's)
                row[kind] = "equal" if got == want_ids else f"differ at token {_first_diff(got, want_ids)}"
            elif got == want:
                row[kind] = "equal"
            elif got.replace(REPLACEMENT, "") == want.replace(REPLACEMENT, ""):
                # the ids decode to a lone partial character inside the text (a random model's answer): a stream
                # drops it (the incremental detokenizer never sends U+FFFD), one decode of all ids keeps it
                row[kind] = "equal but U+FFFD"
            else:
                row[kind] = f"differ at char {_first_diff(got, want)}: {got!r} vs {want!r}"
            ok = ok and row[kind] in ("equal", "equal but U+FFFD")
        rows.append(row)
    return {"all_equal": ok and bool(rows), "rows": rows}


def _first_diff(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def markdown(cmp: dict) -> str:
    kinds = [k for k in SERVED_KINDS if any(k in r for r in cmp["rows"])]
    lines = ["| prompt | in-process tokens | " + " | ".join(kinds) + " |", "|---|---:|" + "---|" * len(kinds)]
    for r in cmp["rows"]:
        lines.append(f"| {r['name']} | {r.get('inproc_tokens', '-')} | "
                     + " | ".join(str(r.get(k, "-")) for k in kinds) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a run's results folder (openai.json, inproc.json)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="default: the engine folder the run recorded")
    a = ap.parse_args(argv)
    served = json.loads((a.results / "openai.json").read_text())["probes"]
    inproc = json.loads((a.results / "inproc.json").read_text())["probes"]
    tok = a.tokenizer or Path(json.loads((a.results / "openai.json").read_text())["engine"])
    cmp = compare(served["answers"], inproc["answers"], tok)
    print(markdown(cmp))
    print("all equal" if cmp["all_equal"] else "NOT all equal")
    return 0 if cmp["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
