"""The LLM-API LoRA names this project writes, checked against the facts recorded from TensorRT-LLM."""

from __future__ import annotations

import json

import pytest

from plugins.llmapi_args import LLM_API_ARGS
from tests.conftest import REPO

DIRS = {"1.2.1": "trtllm_1_2_1", "1.4": "trtllm_1_4"}


def _facts(release: str) -> dict:
    return json.loads((REPO / "tests" / "facts" / DIRS[release] / "lora_llmapi.json").read_text())


@pytest.mark.parametrize("release", list(LLM_API_ARGS))
def test_lora_config_fields_are_the_recorded_ones(release):
    facts = _facts(release)
    args = LLM_API_ARGS[release]
    assert args.nested["lora_config"] == set(facts["lora_config"]["fields"])
    assert {"lora_config", "enable_lora"} <= args.fields and set(facts["llm_args"]) <= args.fields | {
        "validate_lora_config_consistency"}


@pytest.mark.parametrize("release", list(LLM_API_ARGS))
def test_the_keys_written_exist_with_the_recorded_types(release):
    from builders.lora import HF_TO_TRTLLM

    fields = _facts(release)["lora_config"]["fields"]
    written = {"max_lora_rank": "int", "max_loras": "Optional[int]", "max_cpu_loras": "Optional[int]",
               "lora_target_modules": "List[str]", "lora_dir": "List[str]"}
    assert {k: fields[k]["type"] for k in written} == written
    # the module names written are TensorRT-LLM's for the HF names the adapter reader serves (the default map)
    default = _facts("1.2.1")["lora_config"]["default_trtllm_modules_to_hf_modules"]
    assert {default[t]: t for t in HF_TO_TRTLLM.values()} == HF_TO_TRTLLM
