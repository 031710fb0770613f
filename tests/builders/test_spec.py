"""The build spec: shipped JSON Schema in sync, shipped YAMLs valid, errors naming the right field."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from plugins.errors import SpecError
from builders.spec import json_schema, load_spec

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "build.schema.json"
BUILDS = sorted((ROOT / "configs" / "builds").glob("*.yaml"))


def test_shipped_schema_equals_generated():
    assert json.loads(SCHEMA.read_text()) == json_schema(), \
        "docs/build.schema.json is stale: run `trtpipe schema -o docs/build.schema.json`"


@pytest.mark.parametrize("path", BUILDS, ids=[p.stem for p in BUILDS])
def test_shipped_build_validates_against_schema(path):
    jsonschema.validate(yaml.safe_load(path.read_text()), json.loads(SCHEMA.read_text()))


def test_schema_rejects_unknown_keys_in_overrides():
    schema = json.loads(SCHEMA.read_text())
    bad = {"name": "x", "targets": {"cpu": {"limits": {"max_seq_length": 10}}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "b.yaml"
    p.write_text(text)
    return p


def test_unknown_key_suggests_the_close_one(tmp_path):
    with pytest.raises(SpecError) as err:
        load_spec(_write(tmp_path, "name: b\nlimits: {max_seq_length: 10}\n"), "cpu")
    p = err.value.problems[0]
    assert (p.field, p.code) == ("limits.max_seq_length", "unknown_key")
    assert "Did you mean 'max_seq_len'" in p.fix


def test_override_wins_and_is_recorded(tmp_path):
    b = load_spec(_write(tmp_path, "name: b\nlimits: {max_batch_size: 8}\n"
                                   "targets: {cpu: {}, h100: {runtime: trtllm, limits: {max_batch_size: 64}}}\n"), "h100")
    assert b.settings.limits.max_batch_size == 64 and b.settings.runtime == "trtllm"
    assert b.where("limits.max_batch_size") == "targets.h100.limits.max_batch_size"
    assert b.where("limits.max_seq_len") == "limits.max_seq_len"


def test_parallelism_defaults_and_world_size(tmp_path):
    b = load_spec(_write(tmp_path, "name: b\nparallelism: {tp_size: 2, pp_size: 3}\n"), "cpu")
    par = b.settings.parallelism
    assert (par.num_nodes, par.gpus_per_node, par.world_size) == (1, None, 6)


def test_every_problem_is_reported_at_once(tmp_path):
    with pytest.raises(SpecError) as err:
        load_spec(_write(tmp_path, "name: b\nruntime: tpu\nlimits: {max_batch_size: 0, tokens_per_block: 48}\n"), "cpu")
    assert set(err.value.fields()) == {"runtime", "limits.max_batch_size", "limits.tokens_per_block"}


def test_docs_family_table_is_the_generated_one():
    from plugins.architectures import support_markdown

    from tests.conftest import REPO

    text = (REPO / "docs" / "writing-a-build-file.md").read_text()
    block = text.split("<!-- families:begin -->\n", 1)[1].split("<!-- families:end -->", 1)[0]
    assert block == support_markdown(), "stale: run `trtpipe families --write-docs docs/writing-a-build-file.md`"
