"""did_you_mean: other tools' names for a key, only where that key is allowed; the close spelling otherwise."""

from __future__ import annotations

import pytest

from builders.spec import LimitsConfig, ParallelismConfig, QuantizationConfig
from plugins.errors import KEY_ALIASES, did_you_mean

SECTIONS = {"parallelism": ParallelismConfig, "limits": LimitsConfig, "quantization": QuantizationConfig}


@pytest.mark.parametrize("name,choices,expected", [
    ("tensor_parallel_size", ParallelismConfig.model_fields, "tp_size"),
    ("Tensor-Parallel-Size", ParallelismConfig.model_fields, "tp_size"),
    ("pp", ParallelismConfig.model_fields, "pp_size"),
    ("ep", ParallelismConfig.model_fields, "moe_ep_size"),
    ("block_size", LimitsConfig.model_fields, "tokens_per_block"),
    ("algo", QuantizationConfig.model_fields, "quant_algo"),
    ("max_batch_sise", LimitsConfig.model_fields, "max_batch_size"),  # no alias: the close spelling
])
def test_did_you_mean(name, choices, expected):
    assert did_you_mean(name, choices) == f" Did you mean '{expected}'?"


def test_alias_is_not_offered_where_its_key_is_not_allowed():
    assert did_you_mean("tp", LimitsConfig.model_fields) == ""
    assert did_you_mean("block_size", ParallelismConfig.model_fields) == ""


def test_every_alias_names_a_spec_key_and_is_not_one():
    keys = {k for model in SECTIONS.values() for k in model.model_fields}
    assert set(KEY_ALIASES) <= keys
    aliases = [a for names in KEY_ALIASES.values() for a in names]
    assert len(aliases) == len(set(aliases)) and not set(aliases) & keys


@pytest.mark.parametrize("name,choices,expected", [
    ("tensor_paralel_size", ParallelismConfig.model_fields, "tp_size"),  # an alias, misspelt
    ("pipline_parallel_size", ParallelismConfig.model_fields, "pp_size"),
    ("kv_cache_dtyp", QuantizationConfig.model_fields, "kv_cache_quant_algo"),
])
def test_a_misspelt_alias_gets_its_key(name, choices, expected):
    assert did_you_mean(name, choices) == f" Did you mean '{expected}'?"


def test_a_key_of_another_level_is_named_by_its_path_where_it_matches_better():
    everywhere = ["parallelism.tp_size", "limits.max_batch_size", "serving.triton_max_batch_size"]
    serving = ["triton_max_batch_size", "streaming"]
    assert did_you_mean("max_batch_size", serving, everywhere) == " Did you mean 'limits.max_batch_size'?"
    assert did_you_mean("max_batch_szie", serving, everywhere) == " Did you mean 'limits.max_batch_size'?"
    assert did_you_mean("triton_max_batch_sise", serving, everywhere) == " Did you mean 'triton_max_batch_size'?"
    assert did_you_mean("tp", LimitsConfig.model_fields, everywhere) == " Did you mean 'parallelism.tp_size'?"
    assert did_you_mean("colour", serving, everywhere) == ""
