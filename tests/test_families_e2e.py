"""Every family built by the pipeline and served by the real tritonserver through the portable runtime.

For each family of plugins.architectures a tiny random checkpoint (tests/families.py) is built with
``run_build`` (runtime pytorch, quant_algo fp8, cpu target: ModelOpt quantization, the checkpoint format
the registry picks, the verify stage, the engine, the repository). The ten ``tensorrt_llm`` models are served
by one tritonserver (the first build's repository, and each other build's model folder under its own name), and greedy tokens for a few prompts,
streamed and not, must equal transformers' own ``generate`` on the engine folder's (dequantized) weights with
the attention the engine records. The verify stage's numbers must be computed (random weights make their
values meaningless). No mocks.
"""

from __future__ import annotations

import json
import math
import queue
import shutil
import uuid
from pathlib import Path

import pytest

from tests.families import FAMILIES, SHORT, save_tiny

pytestmark = pytest.mark.e2e

UNUSED_TOKEN = 49151  # an id no prompt here makes the model emit first: generation runs to max_tokens
PROMPTS = [[1, 504, 3458, 282, 4649, 314, 2], [1, 22, 8, 1212, 7, 9, 30, 5000, 12000]]
MAX_TOKENS = 8


def _spec(path: Path, model_dir: Path) -> Path:
    path.write_text(f"""name: {model_dir.name}
model: {{source: {model_dir}}}
runtime: pytorch
quantization: {{quant_algo: fp8, calibration: {{num_samples: 2, seq_len: 32}}}}
limits: {{max_batch_size: 4, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
gates: {{eval_samples: 2, eval_seq_len: 32}}
targets: {{cpu: {{}}}}
""")
    return path


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{architecture: build folder} for every family, built by the pipeline."""
    from builders.layout import build_dir
    from builders.spec import load_spec
    from pipeline.build import run_build

    root = tmp_path_factory.mktemp("family-builds")
    out = {}
    for arch in FAMILIES:
        model = save_tiny(arch, root / "models" / SHORT[arch], seed=1)
        build = load_spec(_spec(root / f"{SHORT[arch]}.yaml", model), "cpu")
        run_build(build, out_root=root / "build", progress=False)
        out[arch] = build_dir(build, root / "build")
    return out


@pytest.fixture(scope="module")
def server(builds, tmp_path_factory):
    """One tritonserver serving each family's tensorrt_llm model as tensorrt_llm_<family>."""
    from model_repo.generate import default_sys_path
    from pipeline.serve import ServerConfig, TritonServer, free_ports

    tmp = tmp_path_factory.mktemp("family-repo")
    repo = tmp / "model_repo"
    first, *others = builds
    shutil.copytree(builds[first] / "model_repo", repo)  # one whole repository (its ensemble serves the first)
    for arch in others:
        folder = builds[arch]
        dst = repo / _model(arch)
        shutil.copytree(folder / "model_repo" / "tensorrt_llm", dst)
        cfg = dst / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace('name: "tensorrt_llm"', f'name: "{dst.name}"', 1))
    http, grpc, metrics = free_ports(3)
    srv = TritonServer(ServerConfig(model_repository=repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                                    log_file=tmp / "tritonserver.log", ready_timeout_s=600,
                                    python_path=default_sys_path())).start()
    yield srv
    srv.stop()


def _model(arch: str) -> str:
    """The served name of ``arch``'s tensorrt_llm model: the first family keeps its own repository's name."""
    return "tensorrt_llm" if arch == next(iter(FAMILIES)) else f"tensorrt_llm_{SHORT[arch]}"


def _inputs(ids: list[int], streaming: bool):
    import numpy as np
    import tritonclient.grpc as grpcclient

    out = []
    for name, arr, dtype in (("input_ids", np.array([ids], np.int32), "INT32"),
                             ("input_lengths", np.array([[len(ids)]], np.int32), "INT32"),
                             ("request_output_len", np.array([[MAX_TOKENS]], np.int32), "INT32"),
                             ("streaming", np.array([[streaming]]), "BOOL"),
                             ("end_id", np.array([[UNUSED_TOKEN]], np.int32), "INT32")):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def _served(server, model: str, ids: list[int], streaming: bool) -> tuple[list[int], int]:
    """Generated token ids and the number of responses that carried tokens."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.cfg.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer(model, _inputs(ids, streaming), request_id=uuid.uuid4().hex,
                              enable_empty_final_response=True)
    tokens, responses = [], 0
    try:
        while True:
            result, error = got.get(timeout=120)
            assert error is None, error
            out = result.as_numpy("output_ids")
            if out is not None and out.size:
                tokens += out.reshape(-1).tolist()
                responses += 1
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    return tokens, responses


def _reference(engine: Path) -> list[list[int]]:
    """transformers' greedy generate on the engine folder's weights (float32, the engine's attention)."""
    import torch
    from transformers import AutoModelForCausalLM

    attn = json.loads((engine / "engine.json").read_text())["attn_implementation"]
    model = AutoModelForCausalLM.from_pretrained(str(engine), dtype=torch.float32, attn_implementation=attn).eval()
    out = []
    with torch.no_grad():
        for ids in PROMPTS:
            seq = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 eos_token_id=UNUSED_TOKEN, pad_token_id=UNUSED_TOKEN)
            out.append(seq[0, len(ids):].tolist())
    return out


@pytest.mark.parametrize("arch", list(FAMILIES), ids=[SHORT[a] for a in FAMILIES])
def test_served_greedy_tokens_equal_transformers_generate(server, builds, arch):
    ref = _reference(builds[arch] / "engine")
    assert any(len(set(r)) > 1 for r in ref), f"degenerate reference {ref}: the comparison would prove little"
    for ids, want in zip(PROMPTS, ref):
        streamed, chunks = _served(server, _model(arch), ids, True)
        whole, responses = _served(server, _model(arch), ids, False)
        # Without streaming the one response holds the prompt too (exclude_input_in_output defaults to false,
        # as in TensorRT-LLM's backend); streamed responses carry only new tokens.
        assert streamed == want and whole == ids + want, (arch, ids, streamed, whole, want)
        assert chunks > 1 and responses == 1, (chunks, responses)


@pytest.mark.parametrize("arch", list(FAMILIES), ids=[SHORT[a] for a in FAMILIES])
def test_each_family_took_its_format_and_was_verified(builds, arch):
    from plugins.architectures import ARCHITECTURES

    folder = builds[arch]
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["checkpoint_format"] == "hf_unified"  # the portable runtime serves the artifact trtllm-llmapi loads
    engine = json.loads((folder / "engine" / "engine.json").read_text())
    assert engine["checkpoint_format"] == plan["checkpoint_format"]
    assert engine["attn_implementation"] == ARCHITECTURES[arch].portable_attention
    report = json.loads((folder / "verify" / "verify.json").read_text())
    m = report["metrics"]
    assert report["checkpoint_format"] == plan["checkpoint_format"] and report["quant_algo"] == "FP8"
    for key in ("perplexity", "source_perplexity", "top1_agreement", "mean_kl", "max_logit_error"):
        assert math.isfinite(m[key]), (key, m)
    assert m["positions"] > 0 and 0 <= m["top1_agreement"] <= 1
