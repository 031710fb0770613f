"""A client's end_id and the model's end ids (generation_config.json's eos list; Llama 3 has several).

Naming one of the model's end ids keeps the others (before: the client's end_id alone, so a Llama-3 style list
stopped working); any other id replaces them (what `loadtest --ignore-eos` relies on). Both the preprocessing model
(which sends the other end ids as one-token stop words to every runtime; checked on the served default build) and
the portable runtime follow it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.templates import template_module

sampling = template_module("tensorrt_llm_pytorch", "sampling")
MODEL_END_IDS = [2, 0, 1]  # end_id 2 and two more eos ids


@pytest.mark.parametrize("sent, expected", [(None, [2, 0, 1]), (0, [0, 2, 1]), (2, [2, 0, 1]), (7, [7])])
def test_the_portable_runtime_keeps_the_models_other_end_ids(sent, expected):
    assert sampling.request_end_ids(sent, MODEL_END_IDS) == expected


def _end_words(server, end_id=None):
    """Ask the served preprocessing model (gRPC) for a prompt's end id and stop words: (OUT_END_ID, the one-token
    stop words of STOP_WORDS_IDS)."""
    import tritonclient.grpc as grpcclient

    def tensor(name, arr, dtype):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    inputs = [tensor("QUERY", np.array([[b"Hello"]], dtype=object), "BYTES"),
              tensor("REQUEST_OUTPUT_LEN", np.array([[8]], np.int32), "INT32")]
    if end_id is not None:
        inputs.append(tensor("END_ID", np.array([[end_id]], np.int32), "INT32"))
    client = grpcclient.InferenceServerClient(server.cfg.grpc_url)
    try:
        result = client.infer("preprocessing", inputs, client_timeout=60)
    finally:
        client.close()
    words = result.as_numpy("STOP_WORDS_IDS")[0]
    ids, offs = words[0], [o for o in words[1] if o >= 0]
    return int(result.as_numpy("OUT_END_ID")[0, 0]), [int(ids[o - 1]) for o in offs]


@pytest.mark.e2e
def test_preprocessing_keeps_the_models_other_end_ids_as_stop_words(default_server, built_default):
    """Through the served default build (tritonserver, its generated repository): SmolLM2's generation_config.json
    lists the end ids [2, 0], which reach the preprocessing model's config as end_id 2 and stop_token_ids 0."""
    eos = json.loads((built_default / "engine" / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [2, 0], f"the default build's end ids changed: {eos} (this test's expectations assume [2, 0])"
    assert _end_words(default_server) == (2, [0])
    assert _end_words(default_server, 0) == (0, [2])  # one of the model's: the others still stop it
    assert _end_words(default_server, 2) == (2, [0])
    assert _end_words(default_server, 99) == (99, [])  # another id: the client's choice alone
