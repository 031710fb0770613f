"""Security defaults: every listener on 127.0.0.1 unless told otherwise; safetensors only (a pickle checkpoint
is refused with the reason); no checkpoint code runs unless the build file says ``model.trust_remote_code: true``
(a checkpoint whose ``auto_map`` names code of its own is refused before any stage), and then every load of the
checkpoint or its tokenizer, in the build and in the served models, is told."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from builders.model_fetch import check_hf_folder
from pipeline import launch_config, serve
from pipeline.cli import make_parser
from pipeline.openai_frontend import build_parser as frontend_parser
from plugins.errors import SpecError
from model_repo.launch import leader_mode_argv


def _default(cls, name):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def test_every_listener_defaults_to_loopback():
    assert _default(serve.ServerConfig, "address") == "127.0.0.1"
    assert _default(launch_config.FrontendLaunch, "address") == "127.0.0.1"
    assert _default(launch_config.TrtllmServeConfig, "address") == "127.0.0.1"
    assert inspect.signature(launch_config.trtllm_serve_config).parameters["address"].default == "127.0.0.1"
    assert inspect.signature(leader_mode_argv).parameters["address"].default == "127.0.0.1"
    assert frontend_parser().parse_args(["--grpc-url", "x:1", "--model", "m", "--tokenizer", "t", "--max-input-len",
                                         "8", "--max-seq-len", "16"]).host == "127.0.0.1"
    assert make_parser().parse_args(["serve"]).address == "127.0.0.1"
    # and tritonserver is told to bind there, each of its three listeners
    argv = serve.command(serve.ServerConfig(model_repository=Path("/nonexistent")))
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in argv


def test_a_pickle_checkpoint_is_refused_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(SpecError) as e:
        check_hf_folder(tmp_path)
    p = e.value.problems[0]
    assert p.code == "model_pickle" and "run code" in p.rule and "safe_serialization" in p.fix
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_hf_folder(tmp_path)  # safetensors beside it: read those


# --- model.trust_remote_code: off unless the build file asks; every load of the checkpoint follows it -----------

MODEL_AUTO_MAP = {"AutoConfig": "configuration_marker.MarkerConfig",
                  "AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM"}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": [None, "tokenization_marker.MarkerTokenizer"]}


class CodeCheckpoint:
    """A tiny Llama checkpoint (SmolLM2's tokenizer) whose config.json and tokenizer_config.json name modules of its
    own (``auto_map``); the modules append a line to ``marker`` when they are imported and when their classes are
    built, so a test sees whether transformers ran the checkpoint's code."""

    def __init__(self, folder: Path, marker: Path):
        self.folder, self.marker = folder, marker

    def ran(self) -> list[str]:
        return self.marker.read_text().splitlines() if self.marker.is_file() else []


def _code_checkpoint(folder: Path, marker: Path, tie: bool = True) -> CodeCheckpoint:
    import json
    import shutil
    import textwrap

    from tests.conftest import smollm2_tokenizer_dir, tiny_llama_model

    tiny_llama_model(bos_token_id=1, eos_token_id=2, pad_token_id=2, tie=tie).save_pretrained(str(folder))
    src = smollm2_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, folder / name)
    say = f"open({str(marker)!r}, 'a').write"
    (folder / "configuration_marker.py").write_text(textwrap.dedent(f"""\
        from transformers import LlamaConfig
        {say}("configuration_marker imported\\n")

        class MarkerConfig(LlamaConfig):
            pass
        """))
    (folder / "modeling_marker.py").write_text(textwrap.dedent(f"""\
        from transformers import LlamaForCausalLM
        from .configuration_marker import MarkerConfig
        {say}("modeling_marker imported\\n")

        class MarkerForCausalLM(LlamaForCausalLM):
            config_class = MarkerConfig

            def __init__(self, config):
                super().__init__(config)
                {say}("MarkerForCausalLM built\\n")
        """))
    (folder / "tokenization_marker.py").write_text(textwrap.dedent(f"""\
        from transformers import PreTrainedTokenizerFast
        {say}("tokenization_marker imported\\n")

        class MarkerTokenizer(PreTrainedTokenizerFast):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                {say}("MarkerTokenizer built\\n")
        """))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "auto_map": MODEL_AUTO_MAP}, indent=2))
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tok, "tokenizer_class": "MarkerTokenizer",
                                                              "auto_map": TOKENIZER_AUTO_MAP}, indent=2))
    return CodeCheckpoint(folder, marker)


@pytest.fixture(scope="session")
def dynamic_modules(tmp_path_factory):
    """transformers copies a checkpoint's modules into its dynamic-module cache (the package
    ``transformers_modules``) before importing them: into a folder of this session, not the home folder. One folder
    for the session: the package, once imported, keeps the folder it was imported from."""
    import sys

    import transformers.dynamic_module_utils as dmu

    def ours():
        return {k: v for k, v in sys.modules.items() if k == "transformers_modules" or
                k.startswith("transformers_modules.")}

    saved, path, before = dmu.HF_MODULES_CACHE, list(sys.path), ours()
    for name in before:
        del sys.modules[name]
    dmu.HF_MODULES_CACHE = str(tmp_path_factory.mktemp("hf_modules"))
    yield
    for name in ours():
        del sys.modules[name]
    sys.modules.update(before)
    dmu.HF_MODULES_CACHE = saved
    sys.path[:] = path


@pytest.fixture
def code_ckpt(tmp_path, dynamic_modules) -> CodeCheckpoint:
    folder = tmp_path / "code-ckpt"
    return _code_checkpoint(folder, tmp_path / "ran.txt")


def _spec(tmp_path, source: Path, model_extra: str = "", extra: str = "") -> Path:
    path = tmp_path / "b.yaml"
    path.write_text(f"name: b\nmodel: {{source: {source}{model_extra}}}\nquantization: {{quant_algo: none}}\n"
                    f"limits: {{max_batch_size: 2, max_input_len: 32, max_seq_len: 64, max_num_tokens: 64}}\n{extra}")
    return path


def test_trust_remote_code_is_off_unless_the_build_file_says_so(tmp_path, tiny_llama):
    from builders.spec import json_schema, load_spec

    assert load_spec(_spec(tmp_path, tiny_llama), "cpu").model.trust_remote_code is False
    assert load_spec(_spec(tmp_path, tiny_llama, ", trust_remote_code: true"), "cpu").model.trust_remote_code is True
    field = json_schema()["$defs"]["ModelSource"]["properties"]["trust_remote_code"]
    assert field["default"] is False and field["type"] == "boolean"


def _refusal(err):
    found = [p for p in err.value.problems if p.code == "remote_code"]
    assert len(found) == 1, err.value
    return found[0]


def test_a_checkpoint_with_its_own_code_is_refused_before_any_stage(tmp_path, code_ckpt):
    from builders.spec import load_spec
    from pipeline.build import run_build

    build = load_spec(_spec(tmp_path, code_ckpt.folder), "cpu")
    with pytest.raises(SpecError) as err:
        run_build(build, out_root=tmp_path / "out", progress=False, stop_after="checkpoint")
    p = _refusal(err)
    assert (p.field, p.value) == ("model.trust_remote_code", False)
    # its tokenizer class is its own; its model_type (llama) is transformers' own: that code would not be needed
    assert "tokenizer_config.json: AutoTokenizer -> tokenization_marker.MarkerTokenizer" in p.rule
    assert "modeling_marker" not in p.rule and "model.trust_remote_code is false" in p.rule
    assert "read that code" in p.fix and "`model.trust_remote_code: true` in the build file" in p.fix
    assert not (tmp_path / "out").exists() and code_ckpt.ran() == []  # nothing built, none of its code ran


def test_model_code_no_library_class_stands_in_for_is_refused(tmp_path, code_ckpt):
    """A model_type transformers does not know: the config and model classes exist only as the checkpoint's code."""
    import json

    from builders import preflight
    from builders.plan import read_hf_config
    from builders.spec import load_spec
    from plugins.targets import get_target

    cfg = json.loads((code_ckpt.folder / "config.json").read_text())
    (code_ckpt.folder / "config.json").write_text(json.dumps({**cfg, "model_type": "trtpipe_marker"}))
    (code_ckpt.folder / "tokenizer_config.json").unlink()  # and a tokenizer of transformers' own
    build = load_spec(_spec(tmp_path, code_ckpt.folder), "cpu")
    with pytest.raises(SpecError) as err:
        preflight.make_plan(build, get_target("cpu"), read_hf_config(code_ckpt.folder))
    rule = _refusal(err).rule
    assert "config.json: AutoConfig -> configuration_marker.MarkerConfig" in rule
    assert "config.json: AutoModelForCausalLM -> modeling_marker.MarkerForCausalLM" in rule
    assert "tokenizer_config.json" not in rule


def test_code_that_transformers_own_classes_replace_does_not_run_and_the_plan_says_so():
    """Phi-3-mini's config.json names modeling_phi3.py (auto_map), which transformers' own Phi-3 classes replace:
    the shipped build file plans (trust_remote_code off, nothing of the checkpoint's runs) and says why."""
    from builders import preflight
    from builders.spec import load_spec
    from plugins.targets import get_target
    from tests.conftest import REPO, hf_config

    build = load_spec(REPO / "configs" / "builds" / "phi-3-mini.yaml", "h100")
    assert build.model.trust_remote_code is False
    plan = preflight.make_plan(build, get_target("h100"), hf_config("phi-3-mini"))
    assert [(c.entry, c.library_class) for c in plan.custom_code] == [
        ("config.json: AutoConfig -> configuration_phi3.Phi3Config", "Phi3Config"),
        ("config.json: AutoModelForCausalLM -> modeling_phi3.Phi3ForCausalLM", "Phi3ForCausalLM")]
    said = [w for w in plan.warnings if "does not run" in w]
    assert len(said) == 1 and "transformers' own Phi3Config, Phi3ForCausalLM load it instead" in said[0]
    assert "set model.trust_remote_code: true" in said[0]


def test_tokenizer_code_alone_is_refused_too(tmp_path, code_ckpt):
    """config.json without auto_map, tokenizer_config.json with one: the tokenizer's code would run as well."""
    import json

    from builders import preflight
    from builders.plan import read_hf_config
    from builders.spec import load_spec
    from plugins.targets import get_target

    cfg = json.loads((code_ckpt.folder / "config.json").read_text())
    del cfg["auto_map"]
    (code_ckpt.folder / "config.json").write_text(json.dumps(cfg))
    build = load_spec(_spec(tmp_path, code_ckpt.folder), "cpu")
    with pytest.raises(SpecError) as err:
        preflight.make_plan(build, get_target("cpu"), read_hf_config(code_ckpt.folder))
    assert "config.json: AutoModelForCausalLM" not in _refusal(err).rule
    assert "tokenizer_config.json: AutoTokenizer -> tokenization_marker.MarkerTokenizer" in _refusal(err).rule


def test_plan_refuses_it_and_names_the_fix(tmp_path, code_ckpt, capsys):
    from pipeline.cli import main

    spec = _spec(tmp_path, code_ckpt.folder)
    assert main(["plan", str(spec), "--target", "cpu", "--output", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "model.trust_remote_code = False: the checkpoint" in err and "needs Python code of its own" in err
    assert "model.trust_remote_code: true" in err
    assert not (tmp_path / "p.json").exists()


def test_with_the_switch_on_the_plan_warns_that_the_code_will_run_and_records_it(tmp_path, code_ckpt, capsys):
    import json

    from pipeline.cli import main

    spec = _spec(tmp_path, code_ckpt.folder, ", trust_remote_code: true")
    assert main(["plan", str(spec), "--target", "cpu", "--output", str(tmp_path / "p.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "model.trust_remote_code is true: the checkpoint's own Python code" in out
    assert "modeling_marker.MarkerForCausalLM" in out
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["trust_remote_code"] is True
    assert {"entry": "config.json: AutoModelForCausalLM -> modeling_marker.MarkerForCausalLM",
            "library_class": "LlamaForCausalLM"} in plan["custom_code"]
    assert {"entry": "tokenizer_config.json: AutoTokenizer -> tokenization_marker.MarkerTokenizer",
            "library_class": None} in plan["custom_code"]
    assert any("model.trust_remote_code is true" in w for w in plan["warnings"])
    assert code_ckpt.ran() == []  # planning reads config files only


def test_the_switch_on_a_checkpoint_without_code_warns_that_it_is_not_needed(tmp_path, tiny_llama):
    from builders import preflight
    from builders.plan import read_hf_config
    from builders.spec import load_spec
    from plugins.targets import get_target

    build = load_spec(_spec(tmp_path, tiny_llama, ", trust_remote_code: true"), "cpu")
    plan = preflight.make_plan(build, get_target("cpu"), read_hf_config(tiny_llama))
    assert plan.trust_remote_code is True and plan.custom_code == []
    assert any("names no code of its own" in w and "set it false" in w for w in plan.warnings)
    default = preflight.make_plan(load_spec(_spec(tmp_path, tiny_llama), "cpu"), get_target("cpu"),
                                  read_hf_config(tiny_llama))
    assert default.trust_remote_code is False and not any("trust_remote_code" in w for w in default.warnings)


def test_the_build_loads_run_the_checkpoints_code_only_with_the_switch(code_ckpt):
    """Calibration's model load and verify's three loads (tokenizer, source, dequantized checkpoint)."""
    import torch

    from builders.quantize import load_source_model
    from builders.spec import QualityGate
    from builders.verify import verify_checkpoint

    off = load_source_model(code_ckpt.folder, torch.float32, trust_remote_code=False)
    assert type(off).__name__ == "LlamaForCausalLM" and code_ckpt.ran() == []  # the library's class, no code run
    on = load_source_model(code_ckpt.folder, torch.float32, trust_remote_code=True)
    assert type(on).__name__ == "MarkerForCausalLM" and "MarkerForCausalLM built" in code_ckpt.ran()

    gates = QualityGate(eval_samples=1, eval_seq_len=8)
    with pytest.raises(ValueError, match="trust_remote_code"):  # transformers refuses the tokenizer's code
        verify_checkpoint(code_ckpt.folder, code_ckpt.folder, gates)
    before = len(code_ckpt.ran())
    # the folder is an unquantized HF checkpoint: verify dequantizes nothing, the candidate is the source again
    report = verify_checkpoint(code_ckpt.folder, code_ckpt.folder, gates, trust_remote_code=True)
    ran = code_ckpt.ran()[before:]
    assert ran.count("MarkerTokenizer built") == 1 and ran.count("MarkerForCausalLM built") == 2, ran
    assert report["metrics"]["top1_agreement"] == 1.0


@pytest.fixture
def code_engine(code_ckpt, tmp_path) -> Path:
    """The portable runtime's engine folder of the code checkpoint (its code copied beside the weights)."""
    from builders.engine_pytorch import build_pytorch_engine
    from builders.spec import LimitsConfig

    out = tmp_path / "engine"
    out.mkdir()
    build_pytorch_engine(code_ckpt.folder, code_ckpt.folder, out,
                         limits=LimitsConfig(max_batch_size=2, max_input_len=32, max_seq_len=64, max_num_tokens=64))
    return out


def test_the_engine_folder_keeps_the_checkpoints_code_for_the_served_model(code_ckpt, code_engine):
    assert {"configuration_marker.py", "modeling_marker.py", "tokenization_marker.py"} <= {
        p.name for p in code_engine.glob("*.py")}


def test_the_served_model_load_follows_the_parameter(code_ckpt, code_engine):
    """tensorrt_llm (pytorch runtime): its ``trust_remote_code`` parameter reaches the model load, in the stub and
    in the engine worker alike (build_manager)."""
    from tests.templates import template_module
    from trtpipe_runtime.runtime_config import runtime_settings

    engine = template_module("tensorrt_llm_pytorch", "engine_worker")
    limits = {"max_batch_size": 2, "max_input_len": 32, "max_seq_len": 64, "max_num_tokens": 64, "tokens_per_block": 16}
    for switch, cls in (("false", "LlamaForCausalLM"), ("true", "MarkerForCausalLM")):
        settings = runtime_settings({"max_tokens_in_paged_kv_cache": "128", "trust_remote_code": switch}, limits)
        manager, _, _ = engine.build_manager(str(code_engine), settings, "cpu", "float32")
        assert type(manager.model).__name__ == cls, switch
        assert ("MarkerForCausalLM built" in code_ckpt.ran()) is (switch == "true")


def _repository(build, engine_dir: Path, out: Path) -> dict:
    from model_repo.generate import parse_config, plan_repository, write_repository
    from plugins.targets import get_target

    write_repository(plan_repository(build, get_target(build.target), None, engine_dir), out)
    return {m: parse_config((out / m / "config.pbtxt").read_text(), m) for m in ("preprocessing", "postprocessing",
                                                                               "tensorrt_llm")}


def _param(config, key):
    return config.parameters[key].string_value if key in config.parameters else None


def test_the_repository_passes_the_switch_to_every_model_that_loads(tmp_path, tiny_llama):
    """Default build (no custom code): the parameter says false; the LLM API's options say it too."""
    import yaml

    from builders.engine_pytorch import build_pytorch_engine
    from builders.llmapi_options import llm_api_options
    from builders.spec import load_spec

    build = load_spec(_spec(tmp_path, tiny_llama), "cpu")
    engine = tmp_path / "engine"
    engine.mkdir()
    build_pytorch_engine(tiny_llama, tiny_llama, engine, limits=build.limits)
    configs = _repository(build, engine, tmp_path / "repo")
    assert {m: _param(c, "trust_remote_code") for m, c in configs.items()} == {
        "preprocessing": "false", "postprocessing": "false", "tensorrt_llm": "false"}
    for on in (False, True):
        llm = load_spec(_spec(tmp_path, tiny_llama, f", trust_remote_code: {str(on).lower()}",
                              "targets: {h100: {runtime: trtllm-llmapi}}\n"), "h100")
        assert llm_api_options(llm)["trust_remote_code"] is on
    from builders.llmapi_options import options_files

    assert yaml.safe_load(options_files(llm)["llm_api_options.yaml"])["trust_remote_code"] is True


def _fake_pb_utils(monkeypatch):
    import sys
    import types

    pb = types.ModuleType("triton_python_backend_utils")
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)


def _init_template(monkeypatch, relpath: str, config) -> object:
    import json

    from google.protobuf import json_format

    from tests.templates import template_module

    _fake_pb_utils(monkeypatch)
    mod = template_module(relpath.split("/")[0])
    model = mod.TritonPythonModel()
    model.initialize({"model_config": json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))})
    return model


def test_the_tokenizer_models_load_the_checkpoints_code_with_the_switch_on(tmp_path, code_ckpt, code_engine,
                                                                         monkeypatch):
    """Render the repository of a build that asks for it, then run the rendered preprocessing and postprocessing
    models' initialize with their own config: the tokenizer is the checkpoint's class."""
    from builders.spec import BuildSettings, ResolvedBuild, load_spec
    from model_repo.generate import RepositoryError

    # off: the generator, which loads the tokenizer as preprocessing will (its vocab check), cannot load it either
    off = ResolvedBuild(name="b", target="cpu", spec_path="<test>", model={"source": str(code_ckpt.folder)},
                        settings=BuildSettings())
    with pytest.raises(RepositoryError) as err:
        _repository(off, code_engine, tmp_path / "repo-off")
    assert "tokenizer_not_loadable" in err.value.codes()
    build = load_spec(_spec(tmp_path, code_ckpt.folder, ", trust_remote_code: true"), "cpu")
    configs = _repository(build, code_engine, tmp_path / "repo")
    assert {m: _param(c, "trust_remote_code") for m, c in configs.items()} == {
        "preprocessing": "true", "postprocessing": "true", "tensorrt_llm": "true"}
    for name in ("preprocessing", "postprocessing"):
        model = _init_template(monkeypatch, f"{name}/1/model.py", configs[name])
        assert type(model.tokenizer).__name__ == "MarkerTokenizer", name
    # the same config with the switch off: transformers refuses to run the tokenizer's code
    configs["preprocessing"].parameters["trust_remote_code"].string_value = "false"
    with pytest.raises(ValueError, match="trust_remote_code"):
        _init_template(monkeypatch, "preprocessing/1/model.py", configs["preprocessing"])


def test_the_openai_frontend_and_query_load_the_tokenizer_as_preprocessing_does(tmp_path, code_ckpt, code_engine):
    from builders.spec import load_spec
    from pipeline.client import format_chat
    from pipeline.openai_frontend import FrontendConfig, create_app

    build = load_spec(_spec(tmp_path, code_ckpt.folder, ", trust_remote_code: true"), "cpu")
    _repository(build, code_engine, tmp_path / "repo")
    launch = launch_config.frontend_launch(build, serve.ServerConfig(model_repository=tmp_path / "repo"), 9000, code_engine)
    args = frontend_parser().parse_args(launch.argv()[3:])
    assert launch.trust_remote_code is True and args.trust_remote_code is True
    before = code_ckpt.ran().count("MarkerTokenizer built")
    create_app(FrontendConfig("127.0.0.1:1", "b", code_engine, 32, 64, trust_remote_code=args.trust_remote_code))
    format_chat(code_engine, "hello", trust_remote_code=build.model.trust_remote_code)
    assert code_ckpt.ran().count("MarkerTokenizer built") == before + 2
    assert frontend_parser().parse_args(["--grpc-url", "x:1", "--model", "m", "--tokenizer", "t", "--max-input-len",
                                         "8", "--max-seq-len", "16"]).trust_remote_code is False


def test_llm_api_options_cannot_turn_it_on_behind_the_field(tmp_path, tiny_llama):
    from builders import preflight
    from builders.spec import load_spec
    from plugins.targets import get_target

    build = load_spec(_spec(tmp_path, tiny_llama, extra="serving: {llm_api_options: {trust_remote_code: true}}\n"
                                                        "targets: {h100: {runtime: trtllm-llmapi}}\n"), "h100")
    found = [p for p in preflight.spec_problems(build, get_target("h100")) if p.code == "llm_api_trust_remote_code"]
    assert [(p.field, p.value) for p in found] == [("serving.llm_api_options.trust_remote_code", True)]
    assert "model.trust_remote_code" in found[0].fix


def test_the_switch_decides_the_served_stages_keys_only(tmp_path, tiny_llama):
    from builders.spec import load_spec

    off = load_spec(_spec(tmp_path, tiny_llama), "cpu")
    on = load_spec(_spec(tmp_path, tiny_llama, ", trust_remote_code: true"), "cpu")
    for stage in ("model_repo", "bundle"):
        assert off.key_fields(stage)["model.trust_remote_code"] is False
        assert on.key_fields(stage) != off.key_fields(stage)
    for stage in ("checkpoint", "verify", "engine"):  # the same source gives the same weights either way
        assert on.key_fields(stage) == off.key_fields(stage)


@pytest.mark.slow  # a real fp8 build of a tiny model: ModelOpt calibration and export
def test_a_build_that_asks_for_it_runs_the_checkpoints_code_at_every_load(tmp_path, code_ckpt):
    """Calibration's tokenizer and model, verify's tokenizer, source and checkpoint: the checkpoint's classes (the
    stages pass the switch: pipeline/build.py); the repository's models are told (their loads are the tests above);
    manifest and plan say it. Before, transformers was passed nothing and asked on stdin whether to run the code."""
    import json

    from builders.spec import load_spec
    from pipeline.build import run_build

    spec = _spec(tmp_path, code_ckpt.folder, ", trust_remote_code: true").read_text()
    spec = spec.replace("quant_algo: none", "quant_algo: fp8, calibration: {num_samples: 2, seq_len: 16}")
    (tmp_path / "b.yaml").write_text(spec + "gates: {eval_samples: 1, eval_seq_len: 8}\n")
    manifest = run_build(load_spec(tmp_path / "b.yaml", "cpu"), out_root=tmp_path / "out", progress=False)
    ran = code_ckpt.ran()
    assert ran.count("MarkerTokenizer built") >= 2 and ran.count("MarkerForCausalLM built") >= 3, ran
    out = tmp_path / "out" / "b" / "cpu"
    assert manifest["trust_remote_code"] is True
    assert json.loads((out / "plan.json").read_text())["trust_remote_code"] is True
    assert 'key: "trust_remote_code" value: { string_value: "true" }' in (
        out / "model_repo" / "preprocessing" / "config.pbtxt").read_text()


def test_serve_on_loopback_needs_no_key_and_beyond_it_needs_both(monkeypatch):
    """``trtpipe serve``: on 127.0.0.1 nothing is asked (``make serve``); TRITON_ADMIN_KEY, when set, restricts
    Triton's admin APIs there too; another ``--address`` is refused without TRITON_ADMIN_KEY, and without
    TRTPIPE_API_KEY unless ``--no-openai``, before anything starts."""
    from pipeline.cli import _triton_key_args
    from plugins.errors import PipelineError
    from model_repo.launch import triton_restricted_argv

    monkeypatch.delenv("TRITON_ADMIN_KEY", raising=False)
    monkeypatch.delenv("TRTPIPE_API_KEY", raising=False)
    args = make_parser().parse_args(["serve"])
    assert _triton_key_args(args) == []
    args = make_parser().parse_args(["serve", "--address", "0.0.0.0"])
    with pytest.raises(PipelineError, match="set TRITON_ADMIN_KEY"):
        _triton_key_args(args)
    monkeypatch.setenv("TRITON_ADMIN_KEY", "k1")
    with pytest.raises(PipelineError, match="TRTPIPE_API_KEY.*--no-openai"):
        _triton_key_args(args)
    assert _triton_key_args(make_parser().parse_args(["serve", "--address", "0.0.0.0", "--no-openai"])) == \
        triton_restricted_argv("k1")
    monkeypatch.setenv("TRTPIPE_API_KEY", "k2")
    assert _triton_key_args(args) == triton_restricted_argv("k1")
    assert _triton_key_args(make_parser().parse_args(["serve"])) == triton_restricted_argv("k1")
    monkeypatch.setenv("TRITON_ADMIN_KEY", "a:b")
    with pytest.raises(PipelineError, match="TRITON_ADMIN_KEY"):
        _triton_key_args(make_parser().parse_args(["serve"]))
