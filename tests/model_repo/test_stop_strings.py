"""tensorrt_llm_bls's stop_strings (beyond upstream's stop_words, which stay token ids): matched on the decoded
text wherever it falls across tokens, left out of the answer, the runtime's request stopped; on the real
tritonserver serving the default build, streamed and not, with Chinese text."""

from __future__ import annotations

import pytest

from pipeline.client import stream_generate

pytestmark = pytest.mark.e2e


def _ask(server, prompt, stops=None, stream=True, max_tokens=48):
    """The answer's text and its token count from tensorrt_llm_bls (pipeline.client, the project's Triton client)."""
    extra = {"exclude_input_in_output": True, **({"stop_strings": stops} if stops else {})}
    chunks = list(stream_generate(f"127.0.0.1:{server.cfg.grpc_port}", prompt, max_tokens, model="tensorrt_llm_bls",
                                  stream=stream, extra=extra))
    return "".join(c.text for c in chunks), sum(c.num_tokens for c in chunks)


@pytest.mark.parametrize("prompt", ["The history of Paris in three sentences:", "请用中文介绍一下北京的历史。"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_stop_string_ends_the_answer_before_it_wherever_it_falls(default_server, prompt, stream):
    whole, n_whole = _ask(default_server, prompt, stream=stream)
    assert len(whole) > 12, whole
    stop = whole[len(whole) // 2: len(whole) // 2 + 3]  # three characters from the middle: inside tokens, mostly
    cut, n_cut = _ask(default_server, prompt, [stop, "never-generated-⚑"], stream=stream)
    assert cut == whole[:whole.index(stop)]
    if stream:  # the runtime's request was stopped, not run to max_tokens (unstreamed, it comes whole at once)
        assert n_cut < n_whole
