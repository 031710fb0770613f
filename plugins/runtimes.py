"""Runtimes: the registry of what serves a build, each entry owning its traits.

A rule or a stage asks a :class:`Runtime` what it needs (``runtime.sharded``,
``runtime.checkpoint_formats``, ``runtime.launcher``...) instead of comparing runtime names.
Adding a runtime is adding one entry to :data:`RUNTIMES` (``builders.spec`` takes the spec's
``runtime`` choices from it) plus its engine builder and its ``tensorrt_llm`` model template.

The portable runtime's fixed continuous-batching choices (:data:`PORTABLE_RUNTIME_CHOICES`) and
the one KV-slot rule (:func:`kv_slots`) live here too: the plan, the repository generator and
the served model all take them from this module.

Sources: TensorRT-LLM 1.2.1's Triton backend (``triton_backend/scripts/launch_triton_server.py``:
leader-mode mpirun, one ``tritonserver`` per rank, ``shm-region-prefix-name`` per rank, ranks
other than 0 load only ``tensorrt_llm``) and ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``
(``max_tokens_in_paged_kv_cache``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass(frozen=True)
class Runtime:
    """One runtime.

    Attributes:
        name: the spec's ``runtime`` value.
        checkpoint_formats: what the checkpoint stage may write, preferred first: ``trtllm`` (ModelOpt's
            TensorRT-LLM checkpoint, one ``rank{r}.safetensors`` per tp x pp rank) and/or ``hf_unified``
            (ModelOpt's unified HF export). The family decides among them (``plugins.architectures.support``).
        engine: the engine stage: ``pytorch`` (merged, dequantized HF weights), ``trtllm-build`` (a TensorRT
            engine, or the GPU-host bundle where TensorRT-LLM is absent) or ``llmapi`` (the HF checkpoint
            itself, read by TensorRT-LLM's LLM API).
        template: the ``tensorrt_llm`` model template under ``model_repo/templates``.
        sharded: keeps the quantized weights sharded over tp_size x pp_size GPUs (False: one device holds the
            merged model).
        builds_trt_engine: runs ``trtllm-build``, so the plugin decisions become flags.
        launcher: ``tritonserver`` (one process) or ``mpirun`` (leader mode, one tritonserver rank per GPU).
        image: ``ngc-trtllm`` (NGC Triton TensorRT-LLM container) or ``project`` (an image with this
            project's Python stack).
        engine_config: the file in the engine folder that records its limits.
        decoupled_only: answers through decoupled response senders only.
        settings: fixed ``tensorrt_llm`` model parameters of this runtime, (name, value, reason).
        tensorrt_llm_versions: the TensorRT-LLM releases this path works with (the engine path, trtllm-build and
            TensorRT-LLM checkpoints, is in 1.2.x only: removed from 1.3, docs/source/legacy/tensorrt-backend-removal.md;
            the LLM API over HF checkpoints from 1.2.1 on).
    """

    name: str
    checkpoint_formats: tuple[Literal["trtllm", "hf_unified"], ...]
    engine: Literal["pytorch", "trtllm-build", "llmapi"]
    template: str
    sharded: bool
    builds_trt_engine: bool = False
    launcher: Literal["tritonserver", "mpirun"] = "tritonserver"
    image: Literal["ngc-trtllm", "project"] = "ngc-trtllm"
    engine_config: str = "engine.json"
    decoupled_only: bool = False
    settings: tuple[tuple[str, str, str], ...] = field(default=())
    tensorrt_llm_versions: str = ""


PORTABLE_RUNTIME_CHOICES: tuple[tuple[str, str, str], ...] = (
    ("cuda_graph_mode", "auto", "transformers decides whether to capture CUDA graphs"),
    ("async_batching", "false", "the per-request sampling processors need synchronous batching"),
    ("library_defaults", "false", "the planner's sizes (KV pool, blocks, batch token budget), not transformers' own"),
    ("engine_process", "true", "the generation loop runs in its own process (engine_worker.py), not in the stub's "
     "interpreter; false runs it in the stub"),
    ("engine_python", "", "the worker's python; empty: one of the stub's Python version"),
    ("sdpa_backends", "flash,mem_efficient,math", "every attention kernel but cuDNN's (its per-shape plans slow "
     "each new batch shape); 'auto' leaves the choice to torch"),
    ("response_dispatch", "thread", "with engine_process false: a dispatcher thread sends responses ('inline': the "
     "generation thread does)"),
)
"""The portable runtime's fixed choices, written into plan.json and the tensorrt_llm model's config.pbtxt.
Measurements behind them: docs/benchmarks/h200.md."""

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime("pytorch", checkpoint_formats=("hf_unified",), engine="pytorch", template="tensorrt_llm_pytorch",
            sharded=False, image="project", decoupled_only=True, settings=PORTABLE_RUNTIME_CHOICES,
            tensorrt_llm_versions="none needed (transformers serves it)"),
    Runtime("trtllm", checkpoint_formats=("trtllm",), engine="trtllm-build", template="tensorrt_llm_trtllm",
            sharded=True, builds_trt_engine=True, launcher="mpirun", engine_config="config.json",
            tensorrt_llm_versions="1.2.x only (trtllm-build and the C++ backend are removed from 1.3)"),
    Runtime("trtllm-llmapi", checkpoint_formats=("hf_unified",), engine="llmapi", template="tensorrt_llm_llmapi",
            sharded=True, tensorrt_llm_versions="1.2.1 and later (the PyTorch backend, TensorRT-LLM's only one from 1.3)"),
)}
"""Every runtime by name; the spec's ``runtime`` choices."""


def runtime(name: str) -> Runtime:
    """The runtime called ``name`` (a key of :data:`RUNTIMES`; the spec validated it)."""
    return RUNTIMES[name]


def kv_slots(max_batch_size: int, max_seq_len: int, cap: Optional[int] = None,
             pool_tokens: Optional[int] = None) -> tuple[int, str]:
    """KV slots (tokens) a runtime's paged cache is given, and where the number comes from.

    The spec's cap (``serving.max_tokens_in_paged_kv_cache``) wins; else the planner's pool on a GPU
    (``pool_tokens``: memory.kv.capacity_tokens, None on CPU targets); else
    ``max_batch_size x max_seq_len``, so every batch slot can hold a full sequence. The one rule for
    plan.json, every config.pbtxt and the served model.
    """
    if cap:
        return cap, "spec: serving.max_tokens_in_paged_kv_cache"
    if pool_tokens:
        return pool_tokens, ("plan: memory.kv.capacity_tokens (serving.kv_cache_free_gpu_mem_fraction of the GPU "
                             "memory left after weights and activations)")
    return max_batch_size * max_seq_len, "plan: max_batch_size x max_seq_len (every slot can hold a full sequence)"


def leader_mode_argv(world_size: int, model_repo: str, *, http_port, grpc_port, metrics_port,
                     address: str = "127.0.0.1", tritonserver: str = "tritonserver",
                     llm_model: str = "tensorrt_llm") -> list[str]:
    """The ``mpirun`` launcher: ``mpirun -n 1 tritonserver ... : -n 1 tritonserver ...``, one rank per GPU.

    Each rank gets its own Python-backend shared-memory prefix; ranks other than 0 load only the
    ``tensorrt_llm`` model (explicit model control), as TensorRT-LLM's ``launch_triton_server.py`` does.
    """
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        argv += ["-n", "1", tritonserver, f"--model-repository={model_repo}"]
        if rank != 0:
            argv += ["--model-control-mode=explicit", f"--load-model={llm_model}"]
        argv += [f"--http-address={address}", f"--grpc-address={address}", f"--metrics-address={address}",
                 f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                 "--disable-auto-complete-config",
                 f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        if rank != world_size - 1:
            argv.append(":")
    return argv
