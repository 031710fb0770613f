"""Shared fixtures: the default build (built once per session, reused when up to date), a
real tritonserver serving it on free ports, and a tiny random Llama checkpoint with
SmolLM2's real tokenizer for fast stage tests."""

from __future__ import annotations

import os

from plugins.procenv import passive_openmp

passive_openmp()  # first: before any test module imports torch
import shutil
from pathlib import Path

import pytest

import json

REPO = Path(__file__).resolve().parents[1]
"""The checkout the tests run from."""
REPO_ROOT = REPO
DEFAULT_BUILD = REPO / "configs" / "builds" / "smollm2-135m.yaml"
DOUBLE = REPO / "tests" / "doubles" / "trtllm_build.py"
ASSETS = REPO / "tests" / "assets"


def hf_config(name: str) -> dict:
    """The config.json of tests/assets/<name>/ as a dict."""
    return json.loads((ASSETS / name / "config.json").read_text())


@pytest.fixture
def smollm2() -> dict:
    return hf_config("smollm2-135m")


@pytest.fixture
def llama3_8b() -> dict:
    return hf_config("llama-3-8b")


@pytest.fixture(scope="session")
def built_default():
    """Build the embedded default (SmolLM2-135M, int4_awq, pytorch runtime, cpu target).

    Uses the same ``build/`` folder as ``make build-engine``: stages whose keys match are
    reused, so a developer who already built pays nothing; a fresh CI clone builds once
    (about 2.5 minutes on 2 cores, mostly AWQ calibration).
    Returns the build folder (``build/smollm2-135m/cpu``).
    """
    from builders.layout import build_dir
    from pipeline.build import run_build
    from builders.spec import load_spec

    build = load_spec(DEFAULT_BUILD, "cpu")
    root = Path(os.environ["TRTPIPE_TEST_BUILD_ROOT"]) if os.environ.get("TRTPIPE_TEST_BUILD_ROOT") else None
    run_build(build, out_root=root, progress=False)
    return build_dir(build, root)


@pytest.fixture(scope="session")
def default_server(built_default, tmp_path_factory):
    """A real tritonserver on the default build's repository (free ports, 127.0.0.1)."""
    server = start_server(built_default / "model_repo", tmp_path_factory.mktemp("server"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def frontend(default_server, built_default, tmp_path_factory):
    """The OpenAI frontend as ``trtpipe serve`` launches it, in front of :func:`default_server` (a free port). One for
    the session: every module that asks the default build through the OpenAI API shares it (its tests read the
    frontend's and the server's counters as differences, never as absolute values)."""
    from builders.spec import load_spec
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports

    launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), default_server.cfg, free_ports(1)[0],
                             built_default / "engine")
    launch.log_file = tmp_path_factory.mktemp("frontend") / "openai_frontend.log"
    fe = OpenAIFrontend(launch).start()
    yield fe
    fe.stop(10)


@pytest.fixture(scope="session")
def lm_eval_once(tmp_path_factory):
    """tests/pipeline/test_lm_eval.py's ``run_lm_eval`` without its ``out`` argument, run once per distinct command
    for the session (each its own output folder): an lm_eval run against the session's :func:`frontend` is a
    deterministic function of its arguments (greedy, float32), so the modules that compare with the same run
    (test_lm_eval.py, test_trtpipe_eval.py) share it instead of repeating it."""
    from tests.pipeline.test_lm_eval import run_lm_eval

    done: dict = {}

    def run(model: str, endpoint: str, url: str, tokenizer: Path, task: str, *extra: str, **model_args):
        key = (model, endpoint, url, str(tokenizer), task, extra, tuple(sorted(model_args.items())))
        if key not in done:
            done[key] = run_lm_eval(tmp_path_factory.mktemp("lm-eval"), model, endpoint, url, tokenizer, task,
                                    *extra, **model_args)
        return done[key]

    return run


def start_server(model_repo: Path, log_dir: Path):
    """A started real tritonserver on ``model_repo`` (free ports, 127.0.0.1, its log in ``log_dir``); the caller
    stops it."""
    from model_repo.generate import default_sys_path
    from pipeline.serve import ServerConfig, TritonServer, free_ports

    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(model_repository=model_repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                       log_file=log_dir / "tritonserver.log", ready_timeout_s=300, python_path=default_sys_path())
    return TritonServer(cfg).start()


def smollm2_tokenizer_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct folder (its real tokenizer, chat template, generation config)."""
    from builders.model_fetch import fetch_embedded

    return fetch_embedded("smollm2-135m-instruct")




def tiny_llama_model(*, vocab: int = 49152, hidden: int = 64, intermediate: int = 128, layers: int = 2,
                     heads: int = 4, kv_heads: int = 2, max_positions: int = 4096, tie: bool = True, **config):
    """A random LlamaForCausalLM (torch seed 0, eval mode) of the given shape; ``config`` adds LlamaConfig
    fields. The defaults are the shape of the ``tiny_llama`` fixture."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                      tie_word_embeddings=tie, **config)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads) with the SmolLM2 tokenizer (vocab 49152), saved to a folder."""
    out = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama_model(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(str(out))
    src = smollm2_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                 "chat_template.jinja"):
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    return out


def make_peft_adapter(base, out: Path, *, r: int, modules, seed: int = 0, alpha: float | None = None,
                      rslora: bool = False, scale: float = 1.0, **config) -> Path:
    """A PEFT LoRA adapter of ``base`` (a model folder, or a transformers model), made by peft's own API with random
    non-zero weights (``init_lora_weights=False``: B is not zero; ``scale`` multiplies every LoRA weight; ``config``:
    more peft.LoraConfig fields) and saved by PEFT's save_pretrained (adapter_config.json,
    adapter_model.safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = base if isinstance(base, torch.nn.Module) else AutoModelForCausalLM.from_pretrained(str(base),
                                                                                               dtype=torch.float32)
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha or 2 * r, target_modules=list(modules),
                                                  init_lora_weights=False, use_rslora=rslora, **config))
    if scale != 1.0:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.mul_(scale)
    peft_model.save_pretrained(str(out))
    return out


LORA_ADAPTERS = {"fr": dict(r=8, modules=["q_proj", "v_proj"], seed=1),
                 "de": dict(r=16, rslora=True, seed=2, modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"])}
"""The two adapters of the LoRA build (lora_task_id 1 and 2, in this order)."""


@pytest.fixture(scope="session")
def lora_build(tmp_path_factory):
    """The embedded model with the two PEFT adapters of :data:`LORA_ADAPTERS` (made here from it), built for the cpu
    target (int4_rtn: a quantized base without AWQ's search). Returns (resolved build, build folder, {name: adapter
    folder})."""
    from builders.layout import build_dir
    from builders.model_fetch import resolve_source
    from builders.spec import load_spec
    from pipeline.build import run_build

    root = tmp_path_factory.mktemp("lora-build")
    base = resolve_source("embedded:smollm2-135m-instruct")
    folders = {name: make_peft_adapter(base, root / name, **kw) for name, kw in LORA_ADAPTERS.items()}
    spec = root / "smol-lora.yaml"
    spec.write_text("name: smol-lora\n"
                    "quantization: {quant_algo: int4_rtn, group_size: 64, calibration: {num_samples: 2, seq_len: 64}}\n"
                    "limits: {max_batch_size: 8, max_input_len: 512, max_seq_len: 1024, max_num_tokens: 1024}\n"
                    "gates: {eval_samples: 2, eval_seq_len: 128}\n"
                    "lora:\n  adapters:\n" + "".join(f"    {n}: ./{n}\n" for n in folders))
    build = load_spec(spec, "cpu")
    run_build(build, out_root=root / "build", progress=False)
    return build, build_dir(build, root / "build"), folders


@pytest.fixture(scope="session")
def lora_server(lora_build, tmp_path_factory):
    """A real tritonserver on the LoRA build's repository (free ports, 127.0.0.1)."""
    server = start_server(lora_build[1] / "model_repo", tmp_path_factory.mktemp("lora-server"))
    yield server
    server.stop()


def write_spec(path: Path, model_dir: Path, *, target: str = "h100", runtime: str = "trtllm",
               quant: str = "none", extra: str = "") -> Path:
    path.write_text(f"""name: tiny
model: {{source: {model_dir}}}
dtype: float16
quantization: {{quant_algo: {quant}, calibration: {{num_samples: 2, seq_len: 32}}}}
limits: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
targets:
  {target}:
    runtime: {runtime}
{extra}""")
    return path


@pytest.fixture
def trtllm_double():
    """The trtllm-build test double as a Toolchain, injected with ``run_build(..., toolchain=...)``."""
    from tests.doubles.trtllm_build import toolchain

    return toolchain()


MODULE_GROUPS = {"tests/pipeline/test_lm_eval.py": "lm-eval", "tests/pipeline/test_trtpipe_eval.py": "lm-eval",
                 "tests/test_lora_e2e.py": "lora", "tests/test_lora_serving.py": "lora"}
"""Modules that share an expensive session fixture (``lm_eval_once``'s runs, ``lora_build``): ``make test``'s
pytest-xdist workers run each group in one worker, so the fixture is made once, not once per worker."""


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile`` (``make test``), one worker runs each module whole (its module-scoped servers start
    once) and each group of :data:`MODULE_GROUPS` whole. xdist's ``loadgroup`` marks cannot do it under pytest 9.2
    (xdist 3.8 renames ``item._nodeid``, which pytest 9.2 no longer reads)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return MODULE_GROUPS.get(module, module)

    return ModuleGroups(config, log)
