"""Runtimes: the registry of what serves a build, each entry owning its traits.

A rule or a stage asks a :class:`Runtime` what it needs (``runtime.sharded``,
``runtime.checkpoint_formats``, ``runtime.launcher``...) instead of comparing runtime names.
Adding a runtime is adding one entry to :data:`RUNTIMES` (``builders.spec`` takes the spec's
``runtime`` choices from it) plus its engine builder and its ``tensorrt_llm`` model template.

The one KV-slot rule (:func:`kv_slots`) lives here too: the plan, the repository generator and the
served model take it from this module. The portable runtime's fixed choices
(:data:`PORTABLE_RUNTIME_CHOICES`) are the served models' own table (``trtpipe_runtime.params``), read
here for the registry.

How each launcher's command line is built: model_repo.launch. Source of the KV-slot parameter: TensorRT-LLM
1.2.1's Triton backend ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`` (``max_tokens_in_paged_kv_cache``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from trtpipe_runtime.params import PORTABLE_RUNTIME_CHOICES  # noqa: F401 (the plan and generator read it here)


@dataclass(frozen=True)
class Releases:
    """The TensorRT-LLM releases a runtime works with.

    Attributes:
        first: the oldest, (major, minor, patch).
        last_minor: the newest (major, minor) it works with; None: every later release.
        why: one clause on the bound.
    """

    first: tuple[int, int, int]
    last_minor: Optional[tuple[int, int]] = None
    why: str = ""

    @property
    def first_text(self) -> str:
        """``first`` as a version string: ``"1.2.1"``."""
        return ".".join(map(str, self.first))

    def text(self) -> str:
        """``"1.2.x only (why)"`` or ``"1.2.1 and later (why)"``."""
        if self.last_minor is not None:
            span = f"{'.'.join(map(str, self.last_minor))}.x only" if self.last_minor == self.first[:2] else \
                f"{self.first_text} to {'.'.join(map(str, self.last_minor))}.x"
        else:
            span = f"{self.first_text} and later"
        return f"{span} ({self.why})" if self.why else span


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
        tensorrt_llm: the TensorRT-LLM releases this path works with, None where it needs none (the engine path,
            trtllm-build and TensorRT-LLM checkpoints, is in 1.2.x only: removed from 1.3,
            docs/source/legacy/tensorrt-backend-removal.md; the LLM API over HF checkpoints from 1.2.1 on).
        llm_api: TensorRT-LLM's LLM API (PyTorch backend) loads the HF checkpoint: an LLM-API options file
            (llm_api_options.yaml), and the LLM API's speculative and guided decoding.
        openai_server: the program of its own OpenAI-compatible server ("" where it has none).
        host_kv_tier: its KV cache manager can offload blocks to host memory (TensorRT-LLM's has).
        predicted: aiconfigurator's database models its performance.
        guided_backends: the guided-decoding backends it can run (serving.guided_decoding_backend), first the
            default: the portable runtime masks with xgrammar (trtpipe_runtime.grammar); the C++ backend's
            executor GuidedDecodingConfig has xgrammar only; the LLM API takes xgrammar and llguidance
            (tests/facts/trtllm_1_2_1/guided_decoding.json).
        log_prob_tensors: its `tensorrt_llm` model declares this project's log-probability tensors beyond
            upstream's interface (inputs num_top_logprobs, return_prompt_log_probs; outputs top_log_probs,
            top_token_ids, prompt_log_probs, prompt_top_log_probs, prompt_top_token_ids; model_repo.generate's
            LOG_PROB_INPUTS / LOG_PROB_OUTPUTS), and the ensemble and tensorrt_llm_bls carry them. A Python-backend
            model reads them (serving them, or refusing them by name); the C++ backend reads no such input, so a
            request would be answered without them: its repository does not declare them (Triton refuses them).
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
    tensorrt_llm: Optional[Releases] = None
    llm_api: bool = False
    openai_server: str = ""
    host_kv_tier: bool = True
    predicted: bool = True
    guided_backends: tuple[str, ...] = ("xgrammar",)
    log_prob_tensors: bool = False

    @property
    def tensorrt_llm_versions(self) -> str:
        """The releases as prose for the plan and the docs (from :attr:`tensorrt_llm`)."""
        return self.tensorrt_llm.text() if self.tensorrt_llm else "none needed (transformers serves it)"


RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime("pytorch", checkpoint_formats=("hf_unified",), engine="pytorch", template="tensorrt_llm_pytorch",
            sharded=False, image="project", decoupled_only=True, settings=PORTABLE_RUNTIME_CHOICES,
            host_kv_tier=False, predicted=False, log_prob_tensors=True),
    Runtime("trtllm", checkpoint_formats=("trtllm",), engine="trtllm-build", template="tensorrt_llm_trtllm",
            sharded=True, builds_trt_engine=True, launcher="mpirun", engine_config="config.json",
            tensorrt_llm=Releases((1, 2, 1), (1, 2), "trtllm-build and the C++ backend are removed from 1.3")),
    Runtime("trtllm-llmapi", checkpoint_formats=("hf_unified",), engine="llmapi", template="tensorrt_llm_llmapi",
            sharded=True, llm_api=True, openai_server="trtllm-serve", guided_backends=("xgrammar", "llguidance"),
            log_prob_tensors=True,
            tensorrt_llm=Releases((1, 2, 1), None, "the PyTorch backend, TensorRT-LLM's only one from 1.3")),
)}
"""Every runtime by name; the spec's ``runtime`` choices."""


def openai_server_releases(program: str = "trtllm-serve") -> Releases:
    """The TensorRT-LLM releases of the runtime whose own OpenAI server is ``program`` (what its launch scripts and
    messages ask a GPU host for).

    Raises:
        KeyError: no runtime has that server.
    """
    found = [r.tensorrt_llm for r in RUNTIMES.values() if r.openai_server == program and r.tensorrt_llm]
    if not found:
        raise KeyError(program)
    return found[0]


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
