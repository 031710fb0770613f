"""The trtllm-llmapi runtime's per-request options -> TensorRT-LLM 1.2.1 LLM API SamplingParams kwargs.

TensorRT-LLM is not installable here: the mapping is a pure function (request_params.py beside the
model), tested directly. The names it emits are SamplingParams fields of tensorrt_llm/sampling_params.py
(FIELDS below); the written model.py is compiled to catch template errors."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import sys
import types

import numpy as np
import pytest

from model_repo.generate import PASS_OUTPUTS, TEMPLATES, plan_repository, write_python_model, write_repository
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import REPO, smollm2_tokenizer_dir, write_spec
from tests.templates import template_module

_path = TEMPLATES / "tensorrt_llm_llmapi" / "1" / "request_params.py"
TRITON_NP = {"TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_FP32": "float32", "TYPE_BOOL": "bool"}
rp = template_module("tensorrt_llm_llmapi", "request_params")  # as model.py imports it

# SamplingParams fields (TensorRT-LLM 1.2.1, tensorrt_llm/sampling_params.py) this runtime may set.
FIELDS = {"end_id", "pad_id", "max_tokens", "stop", "stop_token_ids", "bad", "bad_token_ids", "n", "best_of",
          "use_beam_search", "top_k", "top_p", "seed", "temperature", "min_tokens", "repetition_penalty",
          "presence_penalty", "frequency_penalty", "logprobs", "return_context_logits",
          "return_generation_logits", "return_perf_metrics"}


def opts(max_new_tokens=16, **inputs):
    kw = {k: inputs.pop(k) for k in ("max_beam_width", "max_batch_size", "stop_words", "bad_words", "decode",
                                     "exclude_input_default", "embedding_bias", "vocab_size") if k in inputs}
    kw.setdefault("max_batch_size", 8)
    return rp.request_options(inputs.get, max_new_tokens=max_new_tokens, **kw)


def test_nothing_sent_is_greedy_with_the_backend_defaults():
    o = opts()
    assert o.sampling == {"max_tokens": 16, "top_k": 1}
    # exclude_input_in_output: false unless sent, the backend's default (docs/model_config.md)
    assert (o.num_sequences, o.beam_search, o.exclude_input, o.return_log_probs) == (1, False, False, False)
    assert (o.context_logits, o.generation_logits, o.embedding_bias) == (False, False, None)


def test_sampling_inputs_map_onto_sampling_params():
    o = opts(temperature=0.7, runtime_top_k=40, runtime_top_p=0.9, seed=2**63 + 5, repetition_penalty=1.1,
             presence_penalty=0.5, frequency_penalty=-0.25, min_tokens=4, return_log_probs=True, end_id=2, pad_id=0)
    assert o.sampling == {"max_tokens": 16, "end_id": 2, "pad_id": 0, "temperature": 0.7, "top_k": 40, "top_p": 0.9,
                          "seed": 2**63 + 5, "repetition_penalty": 1.1, "presence_penalty": 0.5,
                          "frequency_penalty": -0.25, "min_tokens": 4, "logprobs": 1}
    assert o.return_log_probs and set(o.sampling) <= FIELDS


def test_temperature_alone_is_greedy_as_in_tensorrt_llm():
    """TensorRT-LLM: top_k 0 and top_p 0 (unset) mean greedy whatever the temperature (regularizeTopKTopP);
    top_p 1.0 samples the whole distribution."""
    assert opts(temperature=0.8).sampling == {"max_tokens": 16, "top_k": 1}
    assert opts(runtime_top_k=0, runtime_top_p=0.0, temperature=1.0).sampling == {"max_tokens": 16, "top_k": 1}
    assert opts(temperature=0.8, runtime_top_p=1.0).sampling == {"max_tokens": 16, "temperature": 0.8, "top_p": 1.0}


@pytest.mark.parametrize("inputs", [dict(temperature=0.0, runtime_top_k=50), dict(runtime_top_k=1, temperature=1.0),
                                    dict(temperature=0.9), dict(runtime_top_k=0)])
def test_greedy_requests(inputs):
    s = opts(**inputs).sampling
    assert s["top_k"] == 1 and "temperature" not in s and "top_p" not in s


def test_end_id_is_also_the_pad_id_unless_sent():
    assert opts(end_id=7).sampling["pad_id"] == 7


def test_num_return_sequences_and_beam_search():
    o = opts(num_return_sequences=3, temperature=1.0, runtime_top_p=1.0)
    assert o.sampling["n"] == 3 and o.num_sequences == 3 and not o.beam_search
    o = opts(beam_width=4, max_beam_width=4)
    assert o.beam_search and o.num_sequences == 4
    assert {k: o.sampling[k] for k in ("use_beam_search", "best_of", "n")} == {"use_beam_search": True, "best_of": 4,
                                                                               "n": 4}
    assert "top_k" not in o.sampling
    assert opts(beam_width=4, max_beam_width=4, num_return_sequences=2).sampling["n"] == 2


def test_stop_and_bad_words():
    decode = {(5, 6): "five six"}.get
    o = opts(stop_words=[[5, 6], [7]], bad_words=[[9]], decode=lambda ids: decode(tuple(ids)))
    assert o.sampling["stop"] == ["five six"] and o.sampling["stop_token_ids"] == [7]
    assert o.sampling["bad_token_ids"] == [9] and "bad" not in o.sampling


def test_exclude_input_in_output():
    assert opts(exclude_input_in_output=False).exclude_input is False
    assert opts(exclude_input_default=False).exclude_input is False
    assert "exclude_input_from_output" not in opts(exclude_input_in_output=False).sampling  # the model prepends


@pytest.mark.parametrize("inputs, message", [
    (dict(temperature=-1.0), "temperature = -1.0: must be >= 0"),
    (dict(temperature=float("nan")), "temperature = nan: must be a finite number"),
    (dict(runtime_top_k=-3), "top_k = -3: must be >= 0"),
    (dict(runtime_top_p=1.5), "top_p = 1.5: must be in [0, 1]"),
    (dict(repetition_penalty=0.0), "repetition_penalty = 0.0: must be > 0"),
    (dict(presence_penalty=float("inf")), "presence_penalty = inf: must be a finite number"),
    (dict(min_tokens=20), "min_tokens = 20 exceeds max_tokens = 16"),
    (dict(min_tokens=-1), "min_tokens = -1: must be >= 0"),
    (dict(beam_width=2), "beam_width = 2: must be between 1 and the engine's max_beam_width 1"),
    (dict(beam_width=2, max_beam_width=2, num_return_sequences=3), "num_return_sequences = 3 with beam_width = 2"),
    (dict(num_return_sequences=9, temperature=1.0), "num_return_sequences = 9: must be between 1 and max_batch_size 8"),
    (dict(num_return_sequences=2), "num_return_sequences = 2 with greedy decoding gives 2 identical answers"),
    (dict(stop_words=[[5, 6]]), "stop_words with several tokens need the model's tokenizer"),
])
def test_unsupported_values_are_clear_per_request_errors(inputs, message):
    with pytest.raises(rp.RequestOptionError, match=message.replace("[", r"\[").replace("(", r"\(")):
        opts(**inputs)
    assert issubclass(rp.RequestOptionError, ValueError)


def test_request_output_len_must_be_positive():
    with pytest.raises(rp.RequestOptionError, match="must be at least 1"):
        opts(max_new_tokens=0)


class _Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


def test_llmapi_repository_carries_the_mapping_and_its_model_compiles(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smollm2_tokenizer_dir() / name, tok / name)
    (tok / "generation_config.json").write_text('{"eos_token_id": 2}')
    build = load_spec(write_spec(tmp_path / "b.yaml", tok, runtime="trtllm-llmapi"), "h100")
    limits = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256,
              "max_beam_width": 1, "tokens_per_block": 32}
    plan = plan_repository(build, get_target("h100"), None, tmp_path / "engine", tokenizer_dir=tok, engine_built=False)
    write_repository(plan, tmp_path / "repo")
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "request_params.py").read_text() == _path.read_text()
    assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "trtpipe_runtime" / "decoding.py").is_file()
    compile((tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py").read_text(), "model.py", "exec")
    config = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    for name in ("temperature", "runtime_top_k", "runtime_top_p", "seed", "repetition_penalty",
                 "presence_penalty", "frequency_penalty", "min_tokens", "return_log_probs", "num_return_sequences",
                 "beam_width", "exclude_input_in_output", "stop_words_list", "bad_words_list", "embedding_bias",
                 "return_context_logits", "return_generation_logits"):
        assert f'name: "{name}"' in config, name  # every input the mapping reads is declared


# ---- the served model's request path, with Triton's and TensorRT-LLM's objects faked -------------

class _Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self.tensors = {t.name: t.array for t in output_tensors or []}
        self.objects = list(output_tensors or [])  # its own list of the tensors, as the C++ object's vector
        self.error = error


class _Error:
    def __init__(self, message):
        self.text = message


class _Sender:
    """Records what is sent. Like Triton 2.51's stub for outputs the request did not ask for, it erases the response's
    tensors (PruneOutputTensors, with the GIL released: python_backend #390) and records any freed by that erase."""

    def __init__(self):
        self.sent, self.freed = [], []

    def send(self, response, flags=0):
        import weakref

        alive = [weakref.ref(t) for t in response.objects] if response is not None else []
        if response is not None:
            response.objects.clear()
        self.freed += [w for w in alive if w() is None]
        self.sent.append((response, flags))


class _Request:
    def __init__(self, **inputs):
        import numpy as np

        self.inputs = {k: _Tensor(k, np.asarray(v)) for k, v in inputs.items()}
        self.sender = _Sender()

    def get_response_sender(self):
        return self.sender


class _Seq:  # the parts of tensorrt_llm's CompletionOutput the model reads
    def __init__(self, index):
        self.index, self.token_ids, self.logprobs, self.cumulative_logprob, self._seen = index, [], [], 0.0, 0

    @property
    def token_ids_diff(self):
        return self.token_ids[self._seen:]


class _Out:
    def __init__(self, outputs, finished):
        self.outputs, self.finished = outputs, finished


# tensorrt_llm RequestPerfMetrics as the LLM API attaches it, built from the recorded attribute names
# (tests/facts/trtllm_1_2_1/llmapi_perf_metrics.json); the values are made up.
PERF_FACTS = json.loads((REPO / "tests" / "facts" / "trtllm_1_2_1" / "llmapi_perf_metrics.json").read_text())
PERF_VALUES = {"kv_cache_alloc_new_blocks": 2, "kv_cache_reused_blocks": 5, "kv_cache_alloc_total_blocks": 7,
               "acceptance_rate": 0.75, "total_accepted_draft_tokens": 6, "total_draft_tokens": 8}


def _perf_metrics():
    groups: dict = {}
    for output, path in PERF_FACTS["perf_output_of"].items():
        group, attr = path.split(".")
        groups.setdefault(group, {})[attr] = PERF_VALUES[output]
    return types.SimpleNamespace(**{g: types.SimpleNamespace(**a) for g, a in groups.items()})


PERF_METRICS = _perf_metrics()


class _FakeLLM:
    """generate_async streams 3 tokens per sequence (100 + 10 * index + step) with log prob -step/10."""

    def __init__(self):
        self.calls = []

    def generate_async(self, ids, sampling_params, streaming):
        self.calls.append((list(ids), sampling_params, streaming))
        n = sampling_params.get("n", 1)

        async def gen():
            seqs = [_Seq(i) for i in range(n)]
            for step in range(3):
                for s in seqs:
                    s._seen = len(s.token_ids)
                    s.token_ids.append(100 + 10 * s.index + step)
                    s.logprobs.append({s.token_ids[-1]: _Logprob(-step / 10)})
                    s.cumulative_logprob += -step / 10
                    if sampling_params.get("return_perf_metrics"):  # CompletionOutput.request_perf_metrics
                        s.request_perf_metrics = PERF_METRICS
                yield _Out(seqs, finished=step == 2)
        return gen()


@pytest.fixture
def llmapi_model(tmp_path, monkeypatch):
    """The rendered model.py, loaded with a fake triton_python_backend_utils; a fake LLM on a real loop."""
    import asyncio
    import threading
    import types

    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor, fake.InferenceResponse, fake.TritonError = _Tensor, _Response, _Error
    fake.TritonModelException = RuntimeError
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    fake.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the bootstrap edits sys.path
    write_python_model("tensorrt_llm_llmapi", tmp_path / "tensorrt_llm", [])
    folder = tmp_path / "tensorrt_llm" / "1"
    sys.path.insert(0, str(folder))  # the stub imports model.py from its folder
    for name in ("request_params", "trtpipe_runtime.triton_io"):  # the repository's copies, with this pb_utils
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("llmapi_model_under_test", folder / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.TritonPythonModel()
    model.SamplingParams = dict  # records the keyword arguments it is built with
    model.max_input_len, model.max_seq_len, model.max_beam_width, model.max_batch_size = 64, 128, 1, 4
    model.exclude_input_default = False
    model.vocab_size = 1000
    model.output_dtypes = {o.runtime_name: TRITON_NP[o.data_type] for o in PASS_OUTPUTS}
    model.llm = _FakeLLM()
    model.loop = asyncio.new_event_loop()
    thread = threading.Thread(target=model.loop.run_forever, daemon=True)
    thread.start()
    yield model
    model.loop.call_soon_threadsafe(model.loop.stop)
    thread.join(5)


def _run(model, request, final_count=1):
    import time

    model.execute([request])
    deadline = time.time() + 10
    while time.time() < deadline and sum(f for _, f in request.sender.sent) < final_count:
        time.sleep(0.01)
    return request.sender.sent


def test_model_sends_a_clear_error_to_the_bad_request_only(llmapi_model):
    bad = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8], runtime_top_p=[1.5])
    sent = _run(llmapi_model, bad)
    assert len(sent) == 1 and sent[0][1] == 1 and "top_p = 1.5: must be in [0, 1]" in sent[0][0].error.text
    assert not llmapi_model.llm.calls
    beam = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8], beam_width=[2])
    assert "max_beam_width 1" in _run(llmapi_model, beam)[0][0].error.text


def test_model_streams_every_sequence_with_its_index_and_log_probs(llmapi_model):
    req = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8], streaming=[True],
                   temperature=[0.9], runtime_top_p=[1.0], num_return_sequences=[2], return_log_probs=[True],
                   exclude_input_in_output=[False])
    sent = _run(llmapi_model, req)
    ids, params, streaming = llmapi_model.llm.calls[0]
    assert ids == [1, 2, 3] and streaming and params == {"max_tokens": 8, "temperature": 0.9, "top_p": 1.0, "n": 2,
                                                         "logprobs": 1}
    assert [f for _, f in sent][-1] == 1 and sum(f for _, f in sent) == 1  # one FINAL, the last response
    per_seq = {}
    for response, _ in sent:
        t = response.tensors
        seq = int(t["sequence_index"].reshape(-1)[0])
        per_seq.setdefault(seq, []).append(t)
    for seq, responses in per_seq.items():
        tokens = [int(x) for t in responses for x in t["output_ids"].reshape(-1)]
        # streamed: never the prompt, whatever exclude_input_in_output says (the C++ backend's rule)
        assert tokens == [100 + 10 * seq, 101 + 10 * seq, 102 + 10 * seq]
        lps = [round(float(x), 3) for t in responses for x in t["output_log_probs"].reshape(-1)]
        assert lps == [0.0, -0.1, -0.2]
        assert round(float(responses[-1]["cum_log_probs"].reshape(-1)[0]), 3) == -0.3
    assert sorted(per_seq) == [0, 1]
    assert not req.sender.freed  # every output outlives the stub's erase (the model holds them through the send)


def test_seed_is_read_from_the_backends_input_name():
    """The 1.2.1 backend and ensemble call it `seed` (utils.h InputFieldsNames); `random_seed` is the old name."""
    assert opts(seed=11, temperature=1.0).sampling["seed"] == 11
    assert "seed" not in opts(random_seed=11, temperature=1.0).sampling


def test_logits_and_embedding_bias_map_onto_sampling_params():
    o = opts(return_context_logits=True, return_generation_logits=True, embedding_bias=[0.0, 2.5, -1.0],
             vocab_size=10)
    assert o.sampling["return_context_logits"] is True and o.sampling["return_generation_logits"] is True
    assert (o.context_logits, o.generation_logits, o.embedding_bias) == (True, True, [0.0, 2.5, -1.0])
    assert set(o.sampling) <= FIELDS
    assert opts(embedding_bias=[0.0, 0.0]).embedding_bias is None  # all zeros: no bias
    with pytest.raises(rp.RequestOptionError, match="vocab_size 2"):
        opts(embedding_bias=[1.0, 1.0, 1.0], vocab_size=2)
    with pytest.raises(rp.RequestOptionError, match="finite"):
        opts(embedding_bias=[float("nan")])


def test_model_leads_a_non_streaming_answer_with_the_prompt_and_sends_perf_in_backend_dtypes(llmapi_model):
    req = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8], return_perf_metrics=[True])
    sent = _run(llmapi_model, req)
    assert len(sent) == 1 and sent[0][1] == 1
    t = sent[0][0].tensors
    assert [int(x) for x in t["output_ids"].reshape(-1)] == [1, 2, 3, 100, 101, 102]  # exclude_input_in_output false
    assert int(t["sequence_length"].reshape(-1)[0]) == 6 and int(t["batch_index"].reshape(-1)[0]) == 0
    dtypes = {name: str(t[name].dtype) for name in ("kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
                                                    "first_token_time_ns", "acceptance_rate", "total_draft_tokens")}
    assert dtypes == {"kv_cache_alloc_new_blocks": "int32", "kv_cache_alloc_total_blocks": "int32",
                      "first_token_time_ns": "int64", "acceptance_rate": "float32", "total_draft_tokens": "int32"}
    assert llmapi_model.llm.calls[0][1]["return_perf_metrics"] is True  # asked of the LLM API
    passed = {name: t[name].reshape(-1)[0].item() for name in (
        "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "acceptance_rate",
        "total_accepted_draft_tokens", "total_draft_tokens")}
    assert passed == PERF_VALUES
    excluded = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8],
                        exclude_input_in_output=[True])
    assert [int(x) for x in _run(llmapi_model, excluded)[0][0].tensors["output_ids"].reshape(-1)] == [100, 101, 102]


def test_model_reads_the_backends_words_layout(llmapi_model):
    """stop_words_list / bad_words_list rows: token ids, then end offsets padded with -1 ([1, 2, L])."""
    class _Tok:
        def decode(self, ids):
            return {(5, 6): "five six"}[tuple(ids)]

    llmapi_model.llm.tokenizer = _Tok()
    req = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[4],
                   stop_words_list=[[[5, 6, 7, 9, 0], [2, 3, 4, -1, -1]]], bad_words_list=[[[8], [1]]])
    _run(llmapi_model, req)
    params = llmapi_model.llm.calls[0][1]
    assert params["stop"] == ["five six"] and params["stop_token_ids"] == [7, 9]  # [[5, 6], [7], [9]]
    assert params["bad_token_ids"] == [8]


def test_the_model_picks_the_options_file_of_its_release(llmapi_model, tmp_path):
    """llm_api_options-<release>.yaml where the generator wrote one (a release spelling an option differently) for
    that release and later ones; llm_api_options.yaml (the oldest release's) otherwise."""
    pick_file = type(llmapi_model).execute.__globals__["options_file"]
    for name in ("llm_api_options.yaml", "llm_api_options-1.4.yaml"):
        (tmp_path / name).write_text("{}\n")
    pick = {v: pick_file(str(tmp_path), v).rsplit("/", 1)[1] for v in ("1.2.1", "1.3.0rc9", "1.4.0rc4", "1.5.0")}
    assert pick == {"1.2.1": "llm_api_options.yaml", "1.3.0rc9": "llm_api_options.yaml",
                    "1.4.0rc4": "llm_api_options-1.4.yaml", "1.5.0": "llm_api_options-1.4.yaml"}


def test_a_guide_maps_onto_guided_decoding_params():
    """The C++ backend's guide types -> the LLM API GuidedDecodingParams field recorded for 1.2.1."""
    facts = json.loads((REPO / "tests/facts/trtllm_1_2_1/guided_decoding.json").read_text())
    fields = set(facts["llm_api"]["GuidedDecodingParams"]["fields"])
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    assert opts(guided_decoding_guide_type="json_schema", guided_decoding_guide=schema).guided == {"json": schema}
    assert opts(guided_decoding_guide_type="json").guided == {"json_object": True}
    assert opts(guided_decoding_guide_type="regex", guided_decoding_guide="a+").guided == {"regex": "a+"}
    assert opts(guided_decoding_guide_type="ebnf_grammar", guided_decoding_guide='root ::= "x"').guided == \
        {"grammar": 'root ::= "x"'}
    assert set(rp.GUIDE_TO_LLMAPI.values()) <= fields
    assert opts().guided is None
    with pytest.raises(rp.RequestOptionError, match="structural_tag"):
        opts(guided_decoding_guide_type="structural_tag", guided_decoding_guide="{}")


LOGPROB_FACTS = json.loads((REPO / "tests/facts/trtllm_1_2_1/log_probs.json").read_text())["llm_api"]
LOGPROB_FACTS_14 = json.loads((REPO / "tests/facts/trtllm_1_4/log_probs.json").read_text())["llm_api"]
MAPPING = LOGPROB_FACTS["request_mapping"]


def test_log_prob_inputs_map_onto_the_recorded_sampling_params_field():
    """num_top_logprobs k -> logprobs=k and return_log_probs alone -> logprobs=1, the field and values the facts
    record for 1.2.1 (llm_api.request_mapping); a field name of SamplingParams (FIELDS)."""
    field_name = MAPPING["num_top_logprobs"]["sampling_params_field"]
    assert field_name == MAPPING["return_log_probs"]["sampling_params_field"] == rp.LOGPROBS_FIELD
    assert field_name in LOGPROB_FACTS["SamplingParams"] and field_name in FIELDS
    assert MAPPING["num_top_logprobs"]["value"] == "k"
    o = opts(num_top_logprobs=3)
    assert o.sampling[field_name] == 3 and (o.num_top_logprobs, o.return_log_probs) == (3, False)
    o = opts(return_log_probs=True, num_top_logprobs=5, temperature=1.0, runtime_top_p=1.0)
    assert o.sampling[field_name] == 5 and o.return_log_probs and o.num_top_logprobs == 5
    assert opts(return_log_probs=True).sampling[field_name] == MAPPING["return_log_probs"]["value"] == 1
    assert field_name not in opts().sampling and field_name not in opts(num_top_logprobs=0).sampling


def test_prompt_log_probs_and_beam_alternatives_are_refused_with_the_recorded_fact():
    """return_prompt_log_probs: 1.2.1's prompt_logprobs holds the prompt token only when it is among the k most
    likely (llm_api.torch_sampler.prompt_logprobs); num_top_logprobs under beam search: refused upstream."""
    assert MAPPING["return_prompt_log_probs"]["served"] is False
    with pytest.raises(rp.RequestOptionError, match=r"return_prompt_log_probs = true: not served by the trtllm-llmapi "
                                                    r"runtime .*prompt's own token only when it is among them.*runtime "
                                                    r"pytorch"):
        opts(return_prompt_log_probs=True)
    error = LOGPROB_FACTS["torch_sampler"]["beam_search"]["error"]
    upstream = re.search(r"'([^']+)'", error).group(1)
    with pytest.raises(rp.RequestOptionError, match=rf"num_top_logprobs = 2 with beam_width = 2: .*{upstream}"):
        opts(num_top_logprobs=2, beam_width=2, max_beam_width=2)
    assert opts(return_log_probs=True, beam_width=2, max_beam_width=2).sampling["logprobs"] == 1  # k 1 is allowed
    with pytest.raises(rp.RequestOptionError, match="num_top_logprobs = 21: must be between 0 and 20"):
        opts(num_top_logprobs=21)
    o = opts(return_log_probs=True, num_top_logprobs=0, return_prompt_log_probs=False)
    assert o.sampling["logprobs"] == 1 and set(o.sampling) <= FIELDS


# The LLM API's result types, built from the recorded names (llm_api.results): Logprob(logprob, rank) as a slots
# dataclass; CompletionOutput.logprobs a list of {token id: Logprob}, one dict per generated token.
Logprob = dataclasses.make_dataclass(
    "Logprob", [(name, object) for name in LOGPROB_FACTS["results"]["Logprob"]["fields"]], slots=True)
assert LOGPROB_FACTS["results"]["CompletionOutput.logprobs"]["type"] == "list[dict[int, Logprob]]"


def _entry_1_2_1(sampled, k, step):
    """1.2.1's dict: the k most likely only, ranks 1..k (llm_api.torch_sampler.sampled_token_included false); the
    sampled token leads at even steps, is absent at odd ones."""
    top = [(900 + j, -(j + 1) * 0.5) for j in range(k)]
    if step % 2 == 0:
        top[0] = (sampled, -0.1)
    return {token: Logprob(logprob, rank + 1) for rank, (token, logprob) in enumerate(top)}


def _entry_1_4(sampled, k, step):
    """1.4's dict: the sampled token first (rank max(k + 1, its rank)), then the k most likely."""
    top = _entry_1_2_1(sampled, k, step)
    if sampled in top:
        return top
    return {sampled: Logprob(-7.0, k + 1), **top}


@pytest.mark.parametrize("release, entry", [("1.2.1", _entry_1_2_1), ("1.4", _entry_1_4)])
def test_top_log_probs_read_from_either_releases_dicts(release, entry):
    facts = LOGPROB_FACTS if release == "1.2.1" else LOGPROB_FACTS_14
    assert facts["torch_sampler"]["sampled_token_included"] is (release == "1.4")
    entries = [entry(7, 3, 0), entry(8, 3, 1)]
    vals, ids = rp.top_log_probs(entries, 3, 3)  # the third token has no entry: padded
    assert ids == [[7, 901, 902], [900, 901, 902], [-1, -1, -1]]
    assert vals[:2] == [[-0.1, -1.0, -1.5], [-0.5, -1.0, -1.5]] and vals[2] == [float("-inf")] * 3
    assert rp.top_log_probs(entries, 2, 1) == ([[-0.1], [-0.5]], [[7], [900]])
    sampled = rp.sampled_log_probs(entries, [7, 8])
    assert sampled == ([-0.1, float("-inf")] if release == "1.2.1" else [-0.1, -7.0])


def test_sampled_log_probs_from_either_logprobs_layout():
    assert rp.sampled_log_probs([-0.5, -1.0], [3, 4]) == [-0.5, -1.0]
    entries = [{3: Logprob(-0.25, 1), 8: Logprob(-2.0, 2)}, {4: -0.75}]
    assert rp.sampled_log_probs(entries, [3, 4, 5]) == [-0.25, -0.75, 0.0]  # no entry for the third token
    assert rp.sampled_log_probs([{8: Logprob(-2.0, 1)}], [3]) == [float("-inf")]  # a dict without it: no value


class _TopKLLM(_FakeLLM):
    """As _FakeLLM, with CompletionOutput.logprobs shaped as 1.2.1 returns them for logprobs=k (_entry_1_2_1)."""

    def generate_async(self, ids, sampling_params, streaming):
        self.calls.append((list(ids), sampling_params, streaming))
        k = sampling_params.get("logprobs", 0)

        async def gen():
            seq = _Seq(0)
            for step in range(3):
                seq._seen = len(seq.token_ids)
                seq.token_ids.append(100 + step)
                seq.logprobs.append(_entry_1_2_1(seq.token_ids[-1], k, step))
                yield _Out([seq], finished=step == 2)
        return gen()


@pytest.mark.parametrize("streaming", [True, False])
def test_model_sends_the_alternatives_as_the_portable_runtime_does(llmapi_model, streaming):
    """top_log_probs float32 / top_token_ids int32 [1, 1, tokens of the response, k] per response, most likely
    first; output_log_probs -inf where 1.2.1 returned no value for the sampled token."""
    llmapi_model.llm = _TopKLLM()
    req = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8], streaming=[streaming],
                   return_log_probs=[True], num_top_logprobs=[2], exclude_input_in_output=[False])
    sent = _run(llmapi_model, req)
    assert llmapi_model.llm.calls[0][1]["logprobs"] == 2
    tensors = [r.tensors for r, _ in sent]
    assert len(tensors) == (3 if streaming else 1) and all(r.error is None for r, _ in sent)
    for t in tensors:
        n = t["output_log_probs"].shape[-1]
        assert t["top_log_probs"].shape == t["top_token_ids"].shape == (1, 1, n, 2)
        assert (t["top_log_probs"].dtype, t["top_token_ids"].dtype) == (np.float32, np.int32)
    ids = np.concatenate([t["top_token_ids"].reshape(-1, 2) for t in tensors]).tolist()
    vals = np.concatenate([t["top_log_probs"].reshape(-1, 2) for t in tensors]).tolist()
    assert ids == [[100, 901], [900, 901], [102, 901]]
    assert np.allclose(vals, [[-0.1, -1.0], [-0.5, -1.0], [-0.1, -1.0]])
    lps = np.concatenate([t["output_log_probs"].reshape(-1) for t in tensors]).tolist()
    assert np.allclose(lps[0], -0.1) and lps[1] == float("-inf") and np.allclose(lps[2], -0.1)
    plain = _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[8], return_log_probs=[True])
    t = _run(llmapi_model, plain)[0][0].tensors
    assert "top_log_probs" not in t and "top_token_ids" not in t and llmapi_model.llm.calls[1][1]["logprobs"] == 1
