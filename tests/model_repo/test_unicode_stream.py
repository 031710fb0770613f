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
