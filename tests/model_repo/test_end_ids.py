"""A client's end_id and the model's end ids (generation_config.json's eos list; Llama 3 has several).

Naming one of the model's end ids keeps the others (before: the client's end_id alone, so a Llama-3 style list
stopped working); any other id replaces them (what `loadtest --ignore-eos` relies on). Both the preprocessing model
(which sends the other end ids as one-token stop words to every runtime) and the portable runtime follow it.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from builders.model_fetch import resolve_source
from tests.templates import template_module

sampling = template_module("tensorrt_llm_pytorch", "sampling")
MODEL_END_IDS = [2, 0, 1]  # end_id 2 and two more eos ids


@pytest.mark.parametrize("sent, expected", [(None, [2, 0, 1]), (0, [0, 2, 1]), (2, [2, 0, 1]), (7, [7])])
def test_the_portable_runtime_keeps_the_models_other_end_ids(sent, expected):
    assert sampling.request_end_ids(sent, MODEL_END_IDS) == expected


class _T:
    def __init__(self, arr):
        self._a = np.asarray(arr)

    def as_numpy(self):
        return self._a


@pytest.fixture
def preprocessing(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = lambda name, arr: (name, np.asarray(arr))
    pb.get_input_tensor_by_name = lambda request, name: request.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the bootstrap edits sys.path
    mod = template_module("preprocessing")
    model = mod.TritonPythonModel()
    params = {"tokenizer_dir": str(resolve_source("embedded:smollm2-135m-instruct")), "max_input_len": "64",
              "max_seq_len": "128", "end_id": "2", "pad_id": "2", "stop_token_ids": "0,1"}
    model.initialize({"model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in params.items()}})})
    return model


def _end_words(model, end_id=None):
    req = {"QUERY": _T([b"Hello"]), "REQUEST_OUTPUT_LEN": _T([[8]])}
    if end_id is not None:
        req["END_ID"] = _T([[end_id]])
    out = dict(model._tensors(req))
    words = out["STOP_WORDS_IDS"][0]
    ids, offs = words[0], [o for o in words[1] if o >= 0]
    return int(out["OUT_END_ID"][0, 0]), [int(ids[o - 1]) for o in offs]


def test_preprocessing_keeps_the_models_other_end_ids_as_stop_words(preprocessing):
    assert _end_words(preprocessing) == (2, [0, 1])
    assert _end_words(preprocessing, 1) == (1, [2, 0])  # one of the model's: the others still stop it
    assert _end_words(preprocessing, 99) == (99, [])  # another id: the client's choice alone
