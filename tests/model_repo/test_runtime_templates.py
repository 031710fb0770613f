"""The tensorrt_llm model template per runtime: every config parses and the ensemble wiring holds."""

from __future__ import annotations

import shutil
import sys
import types

import pytest

from model_repo.generate import write_repository, plan_repository
from tests.templates import template_module
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import smollm2_tokenizer_dir, write_spec

LIMITS = {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256,
          "max_beam_width": 1, "tokens_per_block": 32}


@pytest.mark.parametrize("runtime", ["trtllm", "trtllm-llmapi"])
def test_repository_for_gpu_runtimes(tmp_path, runtime):
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smollm2_tokenizer_dir() / name, tok / name)
    (tok / "generation_config.json").write_text('{"eos_token_id": [2, 0], "pad_token_id": 2}')
    build = load_spec(write_spec(tmp_path / "b.yaml", tok, runtime=runtime), "h100")
    plan = plan_repository(build, get_target("h100"), None, tmp_path / "engine", tokenizer_dir=tok, engine_built=False)
    configs = write_repository(plan, tmp_path / "repo")
    llm = configs["tensorrt_llm"]
    params = {k: v.string_value for k, v in llm.parameters.items()}
    if runtime == "trtllm":
        assert llm.backend == "tensorrtllm"
        for key in ("gpt_model_type", "gpt_model_path", "batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction",
                    "max_tokens_in_paged_kv_cache", "enable_kv_cache_reuse", "enable_chunked_context",
                    "exclude_input_in_output", "decoding_mode", "max_beam_width", "gpu_device_ids",
                    "participant_ids", "cancellation_check_period_ms", "multi_block_mode", "cuda_graph_mode",
                    "normalize_log_probs"):
            assert params[key] != "", key
        # queue settings are Triton's (dynamic_batching), not parameters: the backend reads no such keys
        assert "max_queue_size" not in params and llm.dynamic_batching.default_queue_policy.max_queue_size == \
            build.settings.serving.max_queue_size
        assert params["decoding_mode"] == "top_k_top_p" and params["gpu_device_ids"] == "0"
        assert params["normalize_log_probs"] == "false"  # OpenAI's log P(token | vocabulary), not the top-k set's
    else:
        assert llm.backend == "python" and params["runtime"] == "trtllm-llmapi"
        assert (tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py").is_file()
    assert llm.model_transaction_policy.decoupled


def test_llmapi_model_reports_missing_tensorrt_llm(monkeypatch):
    """Without tensorrt_llm in the backend's interpreter, initialize fails with Triton's model exception,
    naming what is missing and the way out."""

    class TritonModelException(Exception):
        pass

    pb_utils = types.ModuleType("triton_python_backend_utils")
    pb_utils.TritonModelException = TritonModelException
    pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import fails, installed or not
    monkeypatch.setattr(sys, "path", list(sys.path))  # the bootstrap edits sys.path
    for name in ("tensorrt_llm_llmapi_model", "request_params"):  # dropped again afterwards
        monkeypatch.delitem(sys.modules, name, raising=False)
    model = template_module("tensorrt_llm_llmapi")
    with pytest.raises(TritonModelException, match="needs TensorRT-LLM") as err:
        model.TritonPythonModel().initialize({"model_config": "{}"})
    assert "runtime: pytorch" in str(err.value) and isinstance(err.value.__cause__, ImportError)


def test_bls_leaves_python_backend_threads_for_stops_and_sends():
    """tensorrt_llm_bls lets fewer calls wait for a first response than Triton's Python backend has BLS threads
    (tests/facts/python_backend/backend_config.json, recorded from python_be.cc): a waiting exec() holds one, and
    the `stop` requests and the responses to clients need free ones. Our server command keeps the default pool."""
    import ast
    import json
    from pathlib import Path

    from model_repo.generate import TEMPLATES
    from pipeline.serve import ServerConfig, command

    facts = json.loads((Path(__file__).parents[1] / "facts" / "python_backend" / "backend_config.json").read_text())
    pool = facts["cmdline_defaults"]["thread-pool-size"]
    tree = ast.parse((TEMPLATES / "tensorrt_llm_bls" / "1" / "model.py").read_text())
    pending = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "PENDING_MAX" for t in node.targets))
    assert facts["bls_exec_holds_a_pool_thread_until_first_response"]
    assert 0 < pending <= pool - 8, (pending, pool)
    argv = command(ServerConfig(Path("repo")))
    assert not [a for a in argv if "thread-pool-size" in a] and "--disable-auto-complete-config" in argv


class _Tensor:
    """pb_utils.Tensor's stand-in: a name and a numpy value."""

    def __init__(self, name, value):
        self._name, self.value = name, value

    def name(self):
        return self._name


class _InferenceResponse:
    """pb_utils.InferenceResponse's stand-in: its own list of the tensors, as the C++ object holds its own vector."""

    def __init__(self, output_tensors=(), error=None):
        self.output_tensors = list(output_tensors)


def _stand_in_pb_utils(monkeypatch):
    """``triton_python_backend_utils`` stand-in (only Triton's Python backend has it) for importing a template."""
    pb_utils = types.ModuleType("triton_python_backend_utils")
    pb_utils.Tensor, pb_utils.InferenceResponse = _Tensor, _InferenceResponse
    pb_utils.TritonError = RuntimeError
    pb_utils.Logger = types.SimpleNamespace(log_error=print, log_info=print, log_warn=print)
    pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the bootstrap edits sys.path
    return pb_utils


def test_trivial_stream_keeps_its_outputs_alive_through_the_send(monkeypatch):
    """Triton 2.51's stub erases the outputs a request did not ask for from the response, with the GIL released
    (src/response_sender.cc, PruneOutputTensors; python_backend #390): a tensor freed there crashed the trivial model's
    stub (SIGSEGV, seen on this CPU machine under the frontend benchmark; the load tester asks for num_output_tokens
    alone). The stand-in sender erases every output as the stub would and checks that none was freed by it."""
    import queue
    import threading
    import weakref

    _stand_in_pb_utils(monkeypatch)
    monkeypatch.delitem(sys.modules, "trivial_stream_model", raising=False)
    trivial = template_module("trivial_stream")
    freed, sent, final = [], [], threading.Event()

    class Sender:
        def is_cancelled(self):
            return False

        def send(self, response=None, flags=0):
            if response is not None:
                alive = [weakref.ref(t) for t in response.output_tensors]
                response.output_tensors.clear()  # PruneOutputTensors, for a request that asked for none of them
                freed.extend(w for w in alive if w() is None)
                sent.append(len(alive))
            if flags:
                final.set()

    model = trivial.TritonPythonModel.__new__(trivial.TritonPythonModel)
    model.output_dtypes, model.delay, model.incoming, model.stop = {}, 0, queue.Queue(), threading.Event()
    model.incoming.put(trivial._State(Sender(), 3, False))
    loop = threading.Thread(target=model._loop, daemon=True)
    loop.start()
    assert final.wait(30), "the trivial model sent no final response"
    model.stop.set()
    loop.join(30)
    assert sent == [2, 2, 2]  # text_output and num_output_tokens, one token a step
    assert not freed, f"{len(freed)} output tensors were freed by the stub's erase (only it held them)"


def test_bls_sends_only_the_outputs_the_client_asked_for(monkeypatch):
    """Triton 2.51's Python backend (r24.10) drops a decoupled response's outputs the request did not ask for in the
    stub, with the GIL released (src/response_sender.cc: PruneOutputTensors after gil_scoped_release; fixed in
    r24.12, python_backend commit 3916e43, #390): freeing those tensors there killed the BLS stub with SIGSEGV on
    the GPU host (Python 3.12) when the OpenAI frontend asked for text_output and num_output_tokens only. The BLS
    model builds only the outputs asked for; every output when the backend cannot say."""
    import numpy as np

    _stand_in_pb_utils(monkeypatch)
    monkeypatch.delitem(sys.modules, "tensorrt_llm_bls_model", raising=False)
    bls = template_module("tensorrt_llm_bls")

    class Request:
        def __init__(self, names):
            self.names = names

        def requested_output_names(self):
            if self.names is None:
                raise AttributeError("requested_output_names")  # an older Python backend
            return list(self.names)

    passed = {"sequence_index": np.array([[0]], dtype=np.int32), "cum_log_probs": np.array([[0.5]], np.float32)}
    asked = bls._requested(Request(["text_output", "num_output_tokens"]))
    resp = bls.TritonPythonModel._text_response([b"Paris"], [1], passed, asked)
    assert [t.name() for t in resp.output_tensors] == ["text_output", "num_output_tokens"]
    assert resp.output_tensors[0].value.tolist() == [b"Paris"] and resp.output_tensors[1].value.tolist() == [1]
    resp = bls.TritonPythonModel._text_response([b"Paris"], [1], passed, bls._requested(Request(["cum_log_probs"])))
    assert [(t.name(), t.value.tolist()) for t in resp.output_tensors] == [("cum_log_probs", [[0.5]])]
    every = bls.TritonPythonModel._text_response([b"Paris"], [1], passed, bls._requested(Request(None)))
    assert [t.name() for t in every.output_tensors] == ["text_output", "num_output_tokens", "sequence_index",
                                                        "cum_log_probs"]
    assert bls._asks_for(Request(["output_token_ids"]), "output_token_ids")
    assert not bls._asks_for(Request(None), "output_token_ids")
