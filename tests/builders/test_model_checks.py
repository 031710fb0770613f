"""A model the pipeline cannot export is refused before any heavy step, naming the folder."""

from __future__ import annotations

import json
import shutil

import pytest

from plugins.errors import SpecError
from tests.conftest import REPO_ROOT
from builders.preflight import check_model
from builders.spec import load_spec
from plugins.targets import get_target


def test_non_llama_architecture_is_refused(tmp_path):
    model = tmp_path / "neox"
    model.mkdir()
    cfg = json.loads((REPO_ROOT / "tests/assets/smollm2-135m/config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPTNeoXForCausalLM"], "gpt_neox"
    (model / "config.json").write_text(json.dumps(cfg))
    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    with pytest.raises(SpecError) as err:
        check_model(build, get_target("cpu"), model)
    assert err.value.codes() == ["architecture"] and str(model) in str(err.value)


def test_missing_config_fields_name_the_folder(tmp_path):
    model = tmp_path / "partial"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    with pytest.raises(SpecError) as err:
        check_model(build, get_target("cpu"), model)
    assert str(model) in str(err.value)
