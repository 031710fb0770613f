"""Text whose characters span tokens, through the served default build (tritonserver): a Chinese, emoji and
accented answer streamed through `ensemble` and `tensorrt_llm_bls` comes out with no U+FFFD, and the streamed
pieces joined equal the non-streamed answer (trtpipe_runtime/detokenize.py). The non-streamed answer carries the
prompt (the runtime's exclude_input_in_output default), so the streamed text is its end."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

PROMPTS = ["请用中文介绍一下北京和上海。", "Écris une phrase en français avec des accents, puis trois emoji 🎉."]
MAX_TOKENS = 40


def _answer(server, built_default, prompt, model, stream):
    from pipeline.client import format_chat, stream_generate

    text = format_chat(built_default / "engine", prompt)
    chunks = list(stream_generate(server.cfg.grpc_url, text, MAX_TOKENS, model=model, stream=stream))
    return [c.text for c in chunks if c.text], sum(c.num_tokens for c in chunks)


def _splits_characters(built_default, text):
    """Whether the answer's tokens, decoded one by one, break a character (the case under test)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built_default / "engine"), local_files_only=True)
    return any("\ufffd" in tok.decode([i]) for i in tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["zh", "fr-emoji"])
def test_streamed_text_keeps_every_character_and_equals_the_whole_answer(default_server, built_default, model,
                                                                       prompt):
    pieces, n_streamed = _answer(default_server, built_default, prompt, model, stream=True)
    whole, n_whole = _answer(default_server, built_default, prompt, model, stream=False)
    streamed = "".join(pieces)
    assert _splits_characters(built_default, streamed), f"the answer spans no character across tokens: {streamed!r}"
    assert "".join(whole).endswith(streamed) and len(streamed) > 8
    assert "\ufffd" not in streamed, streamed  # a character max_tokens cut in half is not sent
    assert len(pieces) > 3



def _streamed_bytes(url: str, prompt: str, request_id: str, max_tokens: int) -> bytes:
    """One request streamed through the ensemble with the given ``request_id``: its text_output bytes joined as the
    server sent them (no client-side repair)."""
    import queue

    import tritonclient.grpc as grpcclient

    from pipeline.client import build_inputs

    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("ensemble", build_inputs(prompt, max_tokens, stream=True), request_id=request_id,
                                  enable_empty_final_response=True)
        out = b""
        while True:
            result, error = q.get(timeout=300)
            assert error is None, error
            arr = result.as_numpy("text_output")
            if arr is not None and arr.size:
                out += b"".join(arr.reshape(-1))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def test_a_reused_request_id_never_carries_text_between_requests(default_server, built_default):
    """Clients reuse request ids (upstream's client scripts send a fixed one; a load tester numbers its requests per
    run). A stream that max_tokens ends inside a character holds that character's first bytes back; the next request
    with the same id must not start with them (it did: "\ufffd" before its own text)."""
    from transformers import AutoTokenizer

    from pipeline.client import format_chat

    engine = built_default / "engine"
    tok = AutoTokenizer.from_pretrained(str(engine), local_files_only=True)
    url = default_server.cfg.grpc_url
    chinese = format_chat(engine, "请用中文介绍一下北京和上海。")
    answer = _streamed_bytes(url, chinese, "reference", 16).decode()
    ids = tok.encode(answer, add_special_tokens=False)
    cuts = [n for n in range(1, len(ids)) if tok.decode(ids[:n]).endswith("\ufffd")]
    assert cuts, f"no prefix of the answer ends inside a character: {answer!r}"  # the precondition
    hello = format_chat(engine, "Say hello.")
    alone = _streamed_bytes(url, hello, "another-id", 8)
    for n in cuts[:3]:
        _streamed_bytes(url, chinese, "7", n)  # ends inside a character
        assert _streamed_bytes(url, hello, "7", 8) == alone
