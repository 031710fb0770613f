"""Repository generation: every config parses with Triton's proto, nothing is left unfilled,
and the ensemble wiring is checked."""

from __future__ import annotations

import json
import shutil

import pytest

from model_repo.generate import (ModelPlan, check_ensemble, parse_config, plan_repository, render_config,
                                 runtime_package_files, write_repository)
from plugins.errors import StageError
from tests.conftest import REPO_ROOT
from builders.spec import load_spec
from plugins.targets import get_target


@pytest.fixture
def fake_engine(tmp_path):
    """An engine folder as the pytorch engine stage writes it, without weights (SmolLM2's tokenizer)."""
    from tests.conftest import smollm2_tokenizer_dir

    eng = tmp_path / "engine"
    eng.mkdir()
    (eng / "engine.json").write_text(json.dumps({
        "format": "trtpipe-pytorch-engine", "mapping": {"tp_size": 1, "pp_size": 1, "world_size": 1},
        "build_config": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 2048,
                         "max_beam_width": 1, "tokens_per_block": 32},
        "pretrained_config": {"vocab_size": 49152}}))
    src = smollm2_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(src / name, eng / name)
    (eng / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "pad_token_id": 2}))
    return eng


def _plan(engine, **serving):
    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu",
                      {"serving": serving} if serving else None)
    return build, plan_repository(build, get_target("cpu"), None, engine, sys_path=["/site"])


def test_repository_configs_parse_and_name_their_sources(fake_engine, tmp_path):
    _, plan = _plan(fake_engine)
    configs = write_repository(plan, tmp_path / "repo")
    assert set(configs) == {"ensemble", "tensorrt_llm_bls", "preprocessing", "tensorrt_llm", "postprocessing"}
    llm = configs["tensorrt_llm"]
    assert llm.max_batch_size == 8 and llm.model_transaction_policy.decoupled
    text = (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "${" not in text
    assert "# spec: serving.streaming" in text and "# spec: limits.max_batch_size" in text and "engine.json" not in text
    pre = (tmp_path / "repo" / "preprocessing" / "config.pbtxt").read_text()
    assert 'key: "end_id" value: { string_value: "2" }' in pre
    model_py = (tmp_path / "repo" / "tensorrt_llm" / "1" / "model.py").read_text()
    assert "@@BOOTSTRAP@@" not in model_py and "set_up_sys_path(__file__)" in model_py
    support = tmp_path / "repo" / "tensorrt_llm" / "1" / "trtpipe_runtime"  # what model.py imports, beside it
    assert "TRTPIPE_PYTHONPATH" in (support / "bootstrap.py").read_text()
    for name in configs:  # every Python-backend model folder stands alone: its own copy of the package
        if (tmp_path / "repo" / name / "1" / "model.py").is_file():
            assert sorted(p.name for p in (tmp_path / "repo" / name / "1" / "trtpipe_runtime").glob("*.py")) == \
                sorted(p.name for p in runtime_package_files())
    assert json.loads((tmp_path / "repo" / "tensorrt_llm" / "sys_path.json").read_text()) == ["/site"]


def test_triton_batch_size_above_engine_is_refused(fake_engine):
    with pytest.raises(StageError, match="exceeds the engine's max_batch_size"):
        _plan(fake_engine, triton_max_batch_size=16)


def test_unfilled_placeholder_is_refused(fake_engine):
    _, plan = _plan(fake_engine)
    pre = next(m for m in plan.models if m.name == "preprocessing")
    del pre.values["max_seq_len"]
    with pytest.raises(StageError, match="max_seq_len"):
        render_config(pre)


def test_broken_ensemble_mapping_is_detected(fake_engine):
    _, plan = _plan(fake_engine)
    configs = {m.name: parse_config(render_config(m), m.name) for m in plan.models}
    step = configs["ensemble"].ensemble_scheduling.step[1]
    step.input_map["input_idz"] = step.input_map.pop("input_ids")
    problems = check_ensemble(configs)
    assert any("input_idz" in p for p in problems)


def test_invalid_config_text_fails_to_parse():
    mp = ModelPlan("x", "preprocessing")
    with pytest.raises(StageError, match="not a valid Triton model config"):
        parse_config('name: "x" max_batch_size: "eight"', "x/config.pbtxt")
    assert mp.values == {}


def _mutate_engine(engine, **changes):
    cfg = json.loads((engine / "engine.json").read_text())
    for key, value in changes.items():
        section, name = key.split("__")
        cfg[section][name] = value
    (engine / "engine.json").write_text(json.dumps(cfg))


CROSS_CHECKS = [  # case, the problem's field, its code, what its message says
    ("limits", "limits.max_seq_len", "limits_differ_from_engine",
     "limits.max_seq_len = 2048: the engine was built with max_seq_len = 1024"),
    ("world", "parallelism", "world_size_differs_from_engine",
     "world_size tp x pp = 1 but the engine was built for world_size 2"),
    ("vocab", "model.source", "tokenizer_vocab_above_engine",
     "the tokenizer has 49152 ids but the engine's vocab_size is 1000"),
    ("no_tokenizer", "model.source", "tokenizer_missing",
     "no tokenizer files (tokenizer.json / tokenizer_config.json) in the tokenizer folder"),
    ("triton_batch", "serving.triton_max_batch_size", "triton_batch_vs_engine",
     "serving.triton_max_batch_size = 16: exceeds the engine's max_batch_size 8"),
]


@pytest.mark.parametrize("case, field, code, says", [pytest.param(*c, id=f"{c[0]}-{c[2]}") for c in CROSS_CHECKS])
def test_each_cross_check_refuses_an_inconsistent_repository(fake_engine, tmp_path, case, field, code, says):
    """Each inconsistency is refused by the repository's own cross-check, with the one problem it is about (its
    field, code and message), not by any other error."""
    from model_repo.generate import RepositoryError

    serving = {}
    if case == "limits":
        _mutate_engine(fake_engine, build_config__max_seq_len=1024)
    elif case == "world":
        _mutate_engine(fake_engine, mapping__world_size=2)
    elif case == "vocab":
        _mutate_engine(fake_engine, pretrained_config__vocab_size=1000)
    elif case == "no_tokenizer":
        (fake_engine / "tokenizer.json").unlink()
        (fake_engine / "tokenizer_config.json").unlink()
    else:  # triton_batch: the built engine's max_batch_size (8) is below Triton's
        serving = {"triton_max_batch_size": 16}
    with pytest.raises(RepositoryError) as err:
        _plan(fake_engine, **serving)
    assert code in err.value.codes(), str(err.value)
    assert [(p.field, p.code) for p in err.value.problems] == [(field, code)], str(err.value)
    assert says in str(err.value)
    assert " = " in str(err.value) and "Fix:" in str(err.value)
    assert not (tmp_path / "repo").exists()


def test_spec_only_rules_are_the_preflights_alone(fake_engine):
    """The generator checks the built engine's facts only: a rule of the spec alone (the portable runtime needs the
    decoupled policy) is builders.preflight's, with its one code, refused before any stage runs."""
    from builders import preflight

    build, plan = _plan(fake_engine, streaming=False)  # the repository plan raises nothing of its own
    assert plan.models
    codes = [p.code for p in preflight.spec_problems(build, get_target("cpu"))]
    assert codes == ["pytorch_needs_decoupled"]


@pytest.fixture
def trtllm_engine(tmp_path):
    from builders.engine_trtllm import TRTLLM_VERSION
    from tests.conftest import smollm2_tokenizer_dir

    eng = tmp_path / "trt-engine"
    tok = eng / "tokenizer"
    tok.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smollm2_tokenizer_dir() / name, tok / name)
    (tok / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "pad_token_id": 2}))

    def write(version=TRTLLM_VERSION, paged_ctx=True):
        (eng / "config.json").write_text(json.dumps({"version": version, "pretrained_config": {
            "vocab_size": 49152, "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}},
            "build_config": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128, "max_num_tokens": 256,
                             "max_beam_width": 1, "plugin_config": {"tokens_per_block": 32,
                                                                    "use_paged_context_fmha": paged_ctx}}}))
        return eng
    return write


@pytest.mark.parametrize("case, code", [("version", "engine_version_mismatch"),
                                        ("kv_reuse", "kv_reuse_without_paged_context_fmha")])
def test_trtllm_engine_cross_checks(trtllm_engine, tmp_path, case, code):
    from model_repo.generate import RepositoryError
    from tests.conftest import write_spec

    extra = "    serving: {enable_kv_cache_reuse: true}\n" if case == "kv_reuse" else ""
    build = load_spec(write_spec(tmp_path / "b.yaml", tmp_path, runtime="trtllm", extra=extra), "h100")
    eng = trtllm_engine(version="1.0.0") if case == "version" else trtllm_engine(paged_ctx=False)
    with pytest.raises(RepositoryError) as err:
        plan_repository(build, get_target("h100"), None, eng, tokenizer_dir=eng / "tokenizer")
    assert code in err.value.codes(), str(err.value)


def test_consistent_trtllm_engine_plans(trtllm_engine, tmp_path):
    from tests.conftest import write_spec

    build = load_spec(write_spec(tmp_path / "b.yaml", tmp_path, runtime="trtllm"), "h100")
    eng = trtllm_engine()
    plan = plan_repository(build, get_target("h100"), None, eng, tokenizer_dir=eng / "tokenizer")
    configs = write_repository(plan, tmp_path / "repo")
    assert configs["tensorrt_llm"].dynamic_batching.default_queue_policy is not None
    pre = {k: v.string_value for k, v in configs["preprocessing"].parameters.items()}
    assert pre["end_id"] == "2" and pre["stop_token_ids"] == "0"


@pytest.mark.parametrize("target", ["cpu", "h200"])
def test_plan_runtime_settings_are_what_the_repository_holds(fake_engine, tmp_path, target):
    """plan.json's runtime_settings (what `trtpipe plan` shows, with reasons) and the tensorrt_llm
    config.pbtxt parameters agree value for value; on a GPU the KV pool is the plan's."""
    from builders.plan import compute_plan
    from tests.conftest import hf_config

    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu",
                      {"runtime": "pytorch", "limits": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048,
                                                        "max_num_tokens": 2048, "tokens_per_block": 32}})
    plan = compute_plan(build, get_target(target), hf_config("smollm2-135m"))
    settings = {r.name: r.value for r in plan.runtime_settings}
    assert {"max_tokens_in_paged_kv_cache", "tokens_per_block", "engine_process", "cuda_graph_mode"} <= set(settings)
    assert all(r.reason for r in plan.runtime_settings)
    rp = plan_repository(build, get_target(target), plan, fake_engine, sys_path=["/site"])
    write_repository(rp, tmp_path / "repo")
    params = {k: v.string_value for k, v in parse_config(
        (tmp_path / "repo" / "tensorrt_llm" / "config.pbtxt").read_text(), "tensorrt_llm").parameters.items()}
    assert {k: params[k] for k in settings} == settings
    if target == "h200":
        assert settings["max_tokens_in_paged_kv_cache"] == str(plan.memory.kv.capacity_tokens)


def test_log_prob_tensors_are_declared_where_the_runtime_reads_them(fake_engine, trtllm_engine, tmp_path):
    """The portable runtime's repository declares the log-prob tensors beyond upstream's interface on tensorrt_llm,
    the ensemble (mapped to tensorrt_llm) and tensorrt_llm_bls (which forwards them, and adds output_token_ids);
    the C++ backend's does not (it reads no such input: Triton refuses a request that sends one), and its
    tensorrt_llm_bls adds output_token_ids too, beside upstream's output_log_probs and context_logits, which the OpenAI
    frontend scores with them."""
    from model_repo.generate import BLS_OUTPUTS, LOG_PROB_INPUTS, LOG_PROB_OUTPUTS
    from tests.conftest import write_spec

    ins, outs = {p.runtime_name for p in LOG_PROB_INPUTS}, {p.runtime_name for p in LOG_PROB_OUTPUTS}
    assert ins == {"num_top_logprobs", "return_prompt_log_probs"}
    _, plan = _plan(fake_engine)
    configs = write_repository(plan, tmp_path / "pytorch")
    for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        assert ins <= {i.name for i in configs[name].input} and outs <= {o.name for o in configs[name].output}, name
    assert {o.name for o in configs["tensorrt_llm_bls"].output} - {o.name for o in configs["ensemble"].output} == \
        {p.runtime_name for p in BLS_OUTPUTS} == {"output_token_ids"}
    step = next(s for s in configs["ensemble"].ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    assert ins <= set(step.input_map) and outs <= set(step.output_map)
    bls = {k: v.string_value for k, v in configs["tensorrt_llm_bls"].parameters.items()}
    assert "num_top_logprobs:num_top_logprobs" in bls["runtime_input_names"]
    assert outs <= set(bls["runtime_output_names"].split(","))
    dims = {o.name: list(o.dims) for o in configs["tensorrt_llm"].output}
    assert dims["top_log_probs"] == [-1, -1, -1] and dims["prompt_log_probs"] == [-1]

    build = load_spec(write_spec(tmp_path / "b.yaml", tmp_path, runtime="trtllm"), "h100")
    eng = trtllm_engine()
    trt = write_repository(plan_repository(build, get_target("h100"), None, eng, tokenizer_dir=eng / "tokenizer"),
                           tmp_path / "trtllm")
    for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        names = {i.name for i in trt[name].input} | {o.name for o in trt[name].output}
        assert not names & (ins | outs), name
    bls = {o.name for o in trt["tensorrt_llm_bls"].output}
    assert {"output_token_ids", "output_log_probs", "context_logits"} <= bls
    assert "output_token_ids" not in {o.name for o in trt["ensemble"].output}
    assert "return_context_logits" in {i.name for i in trt["tensorrt_llm_bls"].input}
    forwarded = {k: v.string_value for k, v in trt["tensorrt_llm_bls"].parameters.items()}
    assert "return_context_logits:return_context_logits" in forwarded["runtime_input_names"].split(",")
    assert "context_logits" in forwarded["runtime_output_names"].split(",")
