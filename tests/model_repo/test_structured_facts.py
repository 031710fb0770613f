"""Guided decoding (structured output) and log probabilities, held to the recorded upstream facts.

The facts (tests/facts/trtllm_1_2_1/guided_decoding.json, tests/facts/trtllm_1_2_1/log_probs.json,
tests/facts/trtllm_1_4/guided_decoding.json and tests/facts/trtllm_1_4/log_probs.json) were read from TensorRT-LLM's Triton backend sources
(utils.cc, model_instance_state.cc, the tensorrt_llm template), its examples/generate_xgrammar_tokenizer_info.py
and its serve/LLM API sources. Each file names the commits it was read at. Checked here:

- every fact file names its sources, with full commits;
- the facts agree with the other recorded 1.2.1 / 1.4 facts (templates, LLM args, serve CLI);
- builders/xgrammar_info.py writes the tokenizer-info file with exactly upstream's keys, and xgrammar
  loads it back the way the C++ GuidedDecoder builds its TokenizerInfo;
- generated repositories declare the guided-decoding inputs (and log-prob tensors) with upstream's types and
  dims, and the trtllm `tensorrt_llm` model has the parameters the C++ backend reads;
- the guide types our runtime accepts are the C++ backend's.

Nothing here starts a server; the tokenizer-info tests load SmolLM2's real tokenizer (a few seconds).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from google.protobuf import json_format

FACTS = Path(__file__).resolve().parents[1] / "facts"
FACT_FILES = ("trtllm_1_2_1/guided_decoding.json", "trtllm_1_2_1/log_probs.json", "trtllm_1_4/guided_decoding.json",
              "trtllm_1_4/log_probs.json")
HEX40 = re.compile(r"[0-9a-f]{40}")


def facts(rel: str) -> dict:
    return json.loads((FACTS / rel).read_text())


GUIDED = facts("trtllm_1_2_1/guided_decoding.json")
GUIDED_14 = facts("trtllm_1_4/guided_decoding.json")
LOGPROBS = facts("trtllm_1_2_1/log_probs.json")
LOGPROBS_14 = facts("trtllm_1_4/log_probs.json")
GUIDED_INPUTS = GUIDED["backend_inputs"]
INFO_FILE = GUIDED["tokenizer_info_file"]


# ---------------------------------------------------------------- (a) the records themselves


@pytest.mark.parametrize("rel", FACT_FILES)
def test_fact_file_names_its_sources_with_full_commits(rel):
    src = facts(rel)["source"]
    assert src.get("target") and src.get("how_dated"), "say what version the facts are for and how it was dated"
    files = src["upstream_files"]
    assert files, "no upstream file recorded"
    for f in files:
        assert f.get("repo") and f.get("path") and f.get("note"), f
        commit = f.get("commit")
        if commit is None:  # an index copy whose commit the index does not report, or a published page
            assert f.get("index_id") or f.get("url"), f"{f['path']}: no commit, index id or url"
        else:
            assert HEX40.fullmatch(commit), f"{f['path']}: commit {commit!r} is not 40 hex digits"
    assert any(f.get("commit") for f in files), "at least one source must be pinned to a commit"


def test_guided_facts_agree_with_the_recorded_templates_and_inputs():
    """The guided inputs as recorded here are the ones model_templates.json / inputs_read.json recorded."""
    templates = facts("trtllm_1_2_1/model_templates.json")["models"]
    upstream = {i["name"]: i for i in templates["tensorrt_llm"]["inputs"]}
    read = {i["name"]: i for i in facts("trtllm_1_2_1/inputs_read.json")["inputs"]}
    for name, fact in GUIDED_INPUTS.items():
        assert upstream[name]["data_type"] == fact["data_type"] and upstream[name]["dims"] == fact["dims"], name
        assert upstream[name]["optional"] is fact["optional"] is True, name
        assert read[name]["template_data_type"] == fact["data_type"], name
    params = facts("trtllm_1_2_1/backend_parameters.json")["parameters"]
    for key in ("guided_decoding_backend", "xgrammar_tokenizer_info_path"):
        assert key in params and params[key]["required"], key
    assert "xgrammar" in params["guided_decoding_backend"]["values"]
    assert list(GUIDED["guide_types"]) == GUIDED["guide_types_order"]
    assert INFO_FILE["key_order"] == list(INFO_FILE["keys"])


def test_log_prob_facts_agree_with_the_recorded_templates():
    llm = facts("trtllm_1_2_1/model_templates.json")["models"]["tensorrt_llm"]
    inputs = {i["name"]: i for i in llm["inputs"]}
    outputs = {o["name"]: o for o in llm["outputs"]}
    for name, fact in LOGPROBS["backend_inputs"].items():
        if name == "read_in":
            continue
        assert (inputs[name]["data_type"], inputs[name]["dims"]) == (fact["data_type"], fact["dims"]), name
    for name, fact in LOGPROBS["backend_outputs"].items():
        if name == "logits_datatype":
            continue
        assert (outputs[name]["data_type"], outputs[name]["dims"]) == (fact["data_type"], fact["dims"]), name
    flags = facts("trtllm_1_2_1/trtllm_build.json")["flags"]
    for need in ("context_logits", "generation_logits"):
        assert LOGPROBS["engine_requirements"][need]["trtllm_build_flag"] in flags, need


def test_llm_api_log_prob_facts_are_consistent_across_files_and_releases():
    """The LLM API log-prob facts (llm_api sections): the mapping names a recorded SamplingParams field, agrees with
    the recorded trtllm-serve chat mapping, and asks no more alternatives than any recorded release allows."""
    from trtpipe_runtime.decoding import MAX_TOP_LOGPROBS

    api, api_14 = LOGPROBS["llm_api"], LOGPROBS_14["llm_api"]
    field = api["request_mapping"]["num_top_logprobs"]["sampling_params_field"]
    assert api["SamplingParams"][field] == {"type": "Optional[int]", "default": None, "meaning": api["SamplingParams"][
        field]["meaning"]}
    assert f"SamplingParams.{field} = top_logprobs or 1" == LOGPROBS["trtllm_serve"]["chat"]["pytorch_backend"]
    assert api["request_mapping"]["trtllm_serve_agrees"].endswith(LOGPROBS["trtllm_serve"]["chat"]["pytorch_backend"])
    limits = api_14["SamplingParams"]
    assert MAX_TOP_LOGPROBS <= min(limits["MAX_TOP_LOGPROBS"], limits["MAX_TOP_LOGPROBS_1_3"])
    assert "no upper bound" in api["SamplingParams"]["validation"]  # 1.2.1: nothing to exceed
    assert (api["torch_sampler"]["sampled_token_included"], api_14["torch_sampler"]["sampled_token_included"]) == (
        False, True), "the result reading (request_params.top_log_probs) is written for both shapes"
    assert set(api["results"]["Logprob"]["fields"]) == {"logprob", "rank"}


def test_llm_api_facts_agree_with_the_recorded_llm_args():
    for version, guided in (("trtllm_1_2_1", GUIDED), ("trtllm_1_4", GUIDED_14)):
        args = facts(f"{version}/llm_args.json")
        backend = guided["llm_api"]["guided_decoding_backend"]
        assert backend["values"] == args["guided_decoding_backends"], version
        assert args["torch_llm_args"]["guided_decoding_backend"]["default"] is backend["default"] is None, version
        assert set(guided["llm_api"]["GuidedDecodingParams"]["fields"]) == {
            "json", "regex", "grammar", "json_object", "structural_tag"}, version
    choice = facts("trtllm_1_4/llm_args.json")["trtllm_serve"]["options"]["--tool_parser"]["type"]
    assert re.findall(r"'([^']+)'", choice) == GUIDED_14["tool_parser"]["choices"]
    assert GUIDED["requirements"]["xgrammar"] == "==0.1.25"


# ---------------------------------------------------------------- (b) the tokenizer-info file


@pytest.fixture(scope="module")
def smollm2_dir():
    from tests.conftest import smollm2_tokenizer_dir

    return smollm2_tokenizer_dir()


@pytest.fixture(scope="module")
def smollm2_vocab(smollm2_dir) -> int:
    return json.loads((smollm2_dir / "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="module")
def info_file(smollm2_dir, smollm2_vocab, tmp_path_factory) -> Path:
    from builders.xgrammar_info import write_tokenizer_info

    out = tmp_path_factory.mktemp("xgr") / "tokenizer_info" / INFO_FILE["file_name"]
    assert write_tokenizer_info(smollm2_dir, out, smollm2_vocab) == out
    return out


def _load_as_the_cpp_backend_does(info: dict, vocab_size: int):
    """xgrammar's TokenizerInfo built the way guidedDecoder.cpp builds it: the vocab type and prefix space from
    DetectMetadataFromHF(tokenizer_str), the vocab size from the engine (not the file), the stop ids from the
    file; through xgrammar's public from_vocab_and_metadata."""
    import xgrammar as xgr

    detected = xgr.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])  # the C++ DetectMetadataFromHF
    metadata = {"vocab_type": int(detected["vocab_type"].value), "vocab_size": vocab_size,
                "add_prefix_space": detected["add_prefix_space"], "stop_token_ids": info["stop_token_ids"]}
    return xgr.TokenizerInfo.from_vocab_and_metadata(info["encoded_vocab"], json.dumps(metadata))


def test_tokenizer_info_has_exactly_upstreams_keys(info_file, smollm2_dir):
    from transformers import AutoTokenizer

    from builders.xgrammar_info import INFO_KEYS

    info = json.loads(info_file.read_text())
    assert list(info) == INFO_FILE["key_order"] == list(INFO_KEYS)
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    vocab = tok.get_vocab()
    assert info["encoded_vocab"] == sorted(vocab, key=vocab.get)  # raw token strings, by id
    assert info["tokenizer_str"] == tok.backend_tokenizer.to_str()
    assert info["stop_token_ids"] == [tok.eos_token_id]
    text = info_file.read_text()
    assert text == json.dumps(info), "serialized as upstream's json.dump defaults (ASCII, no indent)"
    assert not [p for p in info_file.parent.iterdir() if p != info_file], "temporary file left behind"


@pytest.mark.parametrize("pad", [0, 64])
def test_xgrammar_loads_the_file_back(info_file, smollm2_dir, smollm2_vocab, pad):
    import xgrammar as xgr
    from transformers import AutoTokenizer

    info = json.loads(info_file.read_text())
    loaded = _load_as_the_cpp_backend_does(info, smollm2_vocab + pad)  # engines pad the vocab
    assert loaded.vocab_size == smollm2_vocab + pad
    assert sorted(loaded.stop_token_ids) == sorted(info["stop_token_ids"])
    reference = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(smollm2_dir)),
                                                   vocab_size=smollm2_vocab + pad)
    assert json.loads(loaded.dump_metadata()) == json.loads(reference.dump_metadata())
    assert loaded.decoded_vocab[:smollm2_vocab] == reference.decoded_vocab[:smollm2_vocab]
    compiled = xgr.GrammarCompiler(loaded).compile_json_schema('{"type": "object"}')
    assert compiled.tokenizer_info.vocab_size == smollm2_vocab + pad


def test_tokenizer_info_stop_ids_and_refusals(smollm2_dir, smollm2_vocab, tmp_path):
    from builders.xgrammar_info import write_tokenizer_info

    out = tmp_path / INFO_FILE["file_name"]
    out.write_text("stale")
    write_tokenizer_info(smollm2_dir, out, smollm2_vocab, stop_token_ids=[2, 0])
    info = json.loads(out.read_text())
    assert info["stop_token_ids"] == [2, 0]
    assert sorted(_load_as_the_cpp_backend_does(info, smollm2_vocab).stop_token_ids) == [0, 2]  # xgrammar sorts
    before = out.read_text()
    with pytest.raises(ValueError, match="smaller than"):
        write_tokenizer_info(smollm2_dir, out, smollm2_vocab - 1)
    with pytest.raises(ValueError, match="outside"):
        write_tokenizer_info(smollm2_dir, out, smollm2_vocab, stop_token_ids=[smollm2_vocab])
    with pytest.raises(ValueError, match="empty"):
        write_tokenizer_info(smollm2_dir, out, smollm2_vocab, stop_token_ids=[])
    with pytest.raises(FileNotFoundError):
        write_tokenizer_info(tmp_path / "missing", out, smollm2_vocab)
    assert out.read_text() == before, "a refused call must leave the file as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


# ---------------------------------------------------------------- (c) our templates and repositories

TRTLLM_TEMPLATE = Path(__file__).resolve().parents[2] / "model_repo" / "templates" / "tensorrt_llm_trtllm" / "config.pbtxt"


def _tokenizer_folder(tmp_path: Path) -> Path:
    from tests.conftest import smollm2_tokenizer_dir

    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smollm2_tokenizer_dir() / name, tok / name)
    (tok / "generation_config.json").write_text('{"eos_token_id": [2, 0], "pad_token_id": 2}')
    return tok


def _gpu_repository(tmp_path: Path, runtime: str) -> dict:
    from builders.spec import load_spec
    from model_repo.generate import plan_repository, write_repository
    from plugins.targets import get_target
    from tests.conftest import write_spec

    tok = _tokenizer_folder(tmp_path)
    build = load_spec(write_spec(tmp_path / "b.yaml", tok, runtime=runtime), "h100")
    plan = plan_repository(build, get_target("h100"), None, tmp_path / "engine", tokenizer_dir=tok,
                           engine_built=False)
    return write_repository(plan, tmp_path / "repo")


def _pytorch_repository(tmp_path: Path) -> dict:
    """The default build's repository (pytorch runtime, cpu target) over an engine folder without weights."""
    from builders.spec import load_spec
    from model_repo.generate import plan_repository, write_repository
    from plugins.targets import get_target
    from tests.conftest import REPO_ROOT

    eng = _tokenizer_folder(tmp_path)
    (eng / "engine.json").write_text(json.dumps({
        "format": "trtpipe-pytorch-engine", "mapping": {"tp_size": 1, "pp_size": 1, "world_size": 1},
        "build_config": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 2048,
                         "max_beam_width": 1, "tokens_per_block": 32},
        "pretrained_config": {"vocab_size": 49152}}))
    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    plan = plan_repository(build, get_target("cpu"), None, eng, sys_path=["/site"])
    return write_repository(plan, tmp_path / "repo")


@pytest.fixture(scope="module", params=["trtllm", "trtllm-llmapi", "pytorch"])
def repository(request, tmp_path_factory) -> tuple[str, dict]:
    """(runtime, {model name: config as a dict}) of a generated repository per runtime."""
    tmp = tmp_path_factory.mktemp(request.param)
    configs = _pytorch_repository(tmp) if request.param == "pytorch" else _gpu_repository(tmp, request.param)
    return request.param, {name: json_format.MessageToDict(c, preserving_proto_field_name=True)
                           for name, c in configs.items()}


def _tensors(config: dict, side: str) -> dict:
    return {t["name"]: t for t in config.get(side, [])}


def _dims(t: dict) -> list[int]:
    return [int(d) for d in t.get("dims", [])]


def test_trtllm_template_has_the_guided_decoding_parameters():
    text = TRTLLM_TEMPLATE.read_text()
    for key, fact in GUIDED["parameters"].items():
        if key == "off_rule":
            continue
        assert f'key: "{key}"' in text, f"the C++ backend reads {key} with no fallback: the model would not load"


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble", "tensorrt_llm_bls"])
def test_models_declare_the_guided_inputs_as_upstream(repository, model):
    runtime, configs = repository
    inputs = _tensors(configs[model], "input")
    for name, fact in GUIDED_INPUTS.items():
        assert name in inputs, f"{runtime}/{model}: no input {name}"
        t = inputs[name]
        assert (t.get("data_type"), _dims(t)) == (fact["data_type"], fact["dims"]), f"{runtime}/{model}: {name}"
        assert t.get("optional", False) is fact["optional"], f"{runtime}/{model}: {name} must be optional"


def test_ensemble_carries_the_guide_to_tensorrt_llm(repository):
    runtime, configs = repository
    steps = configs["ensemble"]["ensemble_scheduling"]["step"]
    llm_step = next(s for s in steps if s["model_name"] == "tensorrt_llm")
    for name in GUIDED_INPUTS:
        assert llm_step.get("input_map", {}).get(name) == name, f"{runtime}: ensemble does not pass {name} on"


def test_trtllm_model_has_the_parameters_and_does_not_leave_guided_decoding_silently_off(repository):
    runtime, configs = repository
    if runtime != "trtllm":
        pytest.skip("the C++ backend's parameters; the Python-backend runtimes read guided_decoding_backend only")
    params = {k: v.get("string_value", "") for k, v in configs["tensorrt_llm"]["parameters"].items()}
    for key in ("guided_decoding_backend", "xgrammar_tokenizer_info_path", "tokenizer_dir"):
        assert key in params, key
    backend = params["guided_decoding_backend"]
    assert backend in {v for v in GUIDED["parameters"]["guided_decoding_backend"]["values"]
                       if v != "other" and "$" not in v}
    if backend:  # upstream turns guided decoding off without a word when the path is empty (off_rule)
        assert params["xgrammar_tokenizer_info_path"].endswith(INFO_FILE["file_name"])


def test_python_runtimes_name_a_known_guided_backend(repository):
    runtime, configs = repository
    if runtime == "trtllm":
        pytest.skip("checked against the C++ backend above")
    params = {k: v.get("string_value", "") for k, v in configs["tensorrt_llm"]["parameters"].items()}
    assert params.get("guided_decoding_backend", "") in {"", *GUIDED["llm_api"]["guided_decoding_backend"]["values"]}


def test_trtllm_model_declares_the_log_prob_tensors_as_upstream(repository):
    runtime, configs = repository
    llm = configs["tensorrt_llm"]
    inputs, outputs = _tensors(llm, "input"), _tensors(llm, "output")
    for name, fact in LOGPROBS["backend_inputs"].items():
        if name == "read_in":
            continue
        assert (inputs[name].get("data_type"), _dims(inputs[name])) == (fact["data_type"], fact["dims"]), name
    for name, fact in LOGPROBS["backend_outputs"].items():
        if name == "logits_datatype":
            continue
        want = {"TYPE_FP32", "TYPE_FP16"} if fact["data_type"] == "${logits_datatype}" else {fact["data_type"]}
        assert outputs[name].get("data_type") in want and _dims(outputs[name]) == fact["dims"], f"{runtime}: {name}"


# ---------------------------------------------------------------- (d) our runtime's guide types


def test_runtime_guide_types_are_the_cpp_backends():
    from trtpipe_runtime.grammar import GUIDE_TYPES

    assert tuple(GUIDE_TYPES) == tuple(GUIDED["guide_types_order"])
