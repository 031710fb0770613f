"""tensorrt_llm_bls's stop_strings (beyond upstream's stop_words, which stay token ids): matched on the decoded
text wherever it falls across tokens, left out of the answer, the runtime's request stopped; on the real
tritonserver serving the default build, streamed and not, with Chinese text."""

from __future__ import annotations

import queue

import numpy as np
import pytest

pytestmark = pytest.mark.e2e


def _ask(server, prompt, stops=None, stream=True, max_tokens=48):
    import tritonclient.grpc as grpcclient

    responses = queue.Queue()
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.cfg.grpc_port}")
    c.start_stream(callback=lambda result, error: responses.put((result, error)))
    values = [("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
              ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
              ("stream", np.array([[stream]]), "BOOL"), ("exclude_input_in_output", np.array([[True]]), "BOOL")]
    if stops:
        values.append(("stop_strings", np.array([[s.encode() for s in stops]], dtype=object), "BYTES"))
    inputs = []
    for name, value, dtype in values:
        t = grpcclient.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        inputs.append(t)
    c.async_stream_infer("tensorrt_llm_bls", inputs, request_id="s", enable_empty_final_response=True)
    text, tokens = [], 0
    try:
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            out = result.as_numpy("text_output")
            if out is not None and out.size:
                text.append(out.reshape(-1)[0].decode())
                tokens += int(result.as_numpy("num_output_tokens").reshape(-1)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "".join(text), tokens
    finally:
        c.stop_stream()


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
