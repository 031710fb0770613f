"""The trtllm-llmapi Triton model's LoRA path: lora_task_id -> generate_async(lora_request=LoRARequest(...)).

The rendered model.py runs with Triton's and TensorRT-LLM's objects faked (the llmapi_model fixture of
test_llmapi_request_params); LoRARequest is a stand-in with the recorded positional fields (lora_name, lora_int_id,
lora_path: tests/facts/trtllm_1_2_1/lora_llmapi.json), so a swapped argument fails here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.conftest import REPO
from tests.model_repo.test_llmapi_request_params import _FakeLLM, _Request, _run, llmapi_model, rp  # noqa: F401

FACTS = {v: json.loads((REPO / "tests" / "facts" / v / "lora_llmapi.json").read_text())
         for v in ("trtllm_1_2_1", "trtllm_1_4")}


@dataclass
class _LoRARequest:  # TensorRT-LLM's field order, checked against the facts below
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"


def test_the_stand_in_has_the_recorded_fields():
    for facts in FACTS.values():
        assert list(_LoRARequest.__dataclass_fields__) == facts["lora_request"]["positional_order"]


class _LoraLLM(_FakeLLM):
    def generate_async(self, ids, sampling_params, streaming, **kw):
        self.kw = kw
        return super().generate_async(ids, sampling_params, streaming)


@pytest.fixture
def lora_model(llmapi_model, tmp_path):
    engine = tmp_path / "engine"
    for name in ("sql", "chat"):
        (engine / "lora" / name).mkdir(parents=True)
    (engine / "lora" / "adapters.json").write_text(json.dumps([
        {"name": "sql", "task_id": 1, "path": "lora/sql", "rank": 4},
        {"name": "chat", "task_id": 2, "path": "lora/chat", "rank": 8}]))
    llmapi_model.lora_table = rp.lora_table(str(engine))
    llmapi_model.LoRARequest = _LoRARequest
    llmapi_model.llm = _LoraLLM()
    return llmapi_model, engine


def _req(**extra):
    return _Request(input_ids=[[1, 2, 3]], input_lengths=[3], request_output_len=[4], **extra)


def test_lora_task_id_sends_the_adapters_lora_request(lora_model):
    model, engine = lora_model
    sent = _run(model, _req(lora_task_id=[2]))
    assert sent[-1][0].error is None and sent[-1][1] == 1
    assert model.llm.kw["lora_request"] == _LoRARequest("chat", 2, str(engine / "lora" / "chat"))


@pytest.mark.parametrize("extra", [{}, {"lora_task_id": [0]}])
def test_no_task_id_or_zero_is_the_base_model(lora_model, extra):
    model, _ = lora_model
    _run(model, _req(**extra))
    assert model.llm.kw == {}  # no lora_request at all


def test_an_unknown_task_id_fails_that_request_naming_the_served_ones(lora_model):
    model, _ = lora_model
    sent = _run(model, _req(lora_task_id=[7]))
    assert len(sent) == 1 and sent[0][1] == 1
    assert sent[0][0].error.text == ("lora_task_id = 7: no such LoRA adapter; this model serves lora_task_id 0 (the "
                                     "base model) and 1 (sql), 2 (chat)")
    assert not model.llm.calls
    assert _run(model, _req(lora_task_id=[1]))[-1][0].error is None  # the next request is served


def test_a_model_without_adapters_refuses_any_task_id(llmapi_model):
    sent = _run(llmapi_model, _req(lora_task_id=[1]))
    assert "no such LoRA adapter" in sent[0][0].error.text and "none: no adapters built" in sent[0][0].error.text


def test_the_table_is_read_relative_to_the_engine_folder(tmp_path):
    assert rp.lora_table(str(tmp_path)) == {}
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapters.json").write_text('[{"name": "a", "task_id": 0, "path": "lora/a", "rank": 2}]')
    with pytest.raises(ValueError, match="task_id 0 must be >= 1"):
        rp.lora_table(str(tmp_path))
