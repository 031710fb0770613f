"""Generate and validate the Triton model repository for a built engine.

Two steps, as data then action: :func:`plan_repository` computes every value each
``config.pbtxt`` will hold together with where it came from (a spec field, the build's plan,
the tokenizer's ``generation_config.json``, or a fixed choice with its reason) and checks the
spec against the engine's own facts (``engine.json``/``config.json``); :func:`write_repository` renders the templates, refuses
any unfilled ``${...}``, parses each config with Triton's ``ModelConfig`` proto (from
tritonclient), checks that every ensemble step maps onto real inputs/outputs, and writes
the folder atomically.

Layout and tensor names follow the TensorRT-LLM backend's
``all_models/inflight_batcher_llm`` of TensorRT-LLM 1.2.1; the facts the generated configs must match
(parameter keys the C++ backend reads, tensor names and dtypes) are recorded in tests/facts/trtllm_1_2_1/.
"""

from __future__ import annotations

import json
import shutil
import string
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from builders.engine_trtllm import TRTLLM_VERSION, engine_facts
from builders.plan import Plan
from builders.preflight import triton_batch_problems
from builders.spec import ENGINE_LIMIT_KEYS
from plugins.errors import Problem, StageError
from plugins.fsutil import atomic_dir
from plugins.runtimes import kv_slots
from builders.xgrammar_info import INFO_NAME as XGRAMMAR_INFO_NAME
import trtpipe_runtime

TEMPLATES = Path(__file__).resolve().parent / "templates"


RUNTIME_PACKAGE = Path(trtpipe_runtime.__file__).resolve().parent
"""The support package every Python-backend model imports (trtpipe_runtime): copied into each one's version
folder (<model>/1/trtpipe_runtime/), where the stub imports model.py from."""


def runtime_package_files() -> list[Path]:
    """The files of :data:`RUNTIME_PACKAGE` a repository gets (its .py files, sorted; no caches)."""
    return sorted(RUNTIME_PACKAGE.glob("*.py"))


@dataclass(frozen=True)
class PassThrough:
    """An optional request input/output carried from the ensemble to the runtime model."""

    ensemble_name: str
    runtime_name: str
    data_type: str
    dims: str = "[ 1 ]"


# Optional ensemble inputs forwarded to `tensorrt_llm` (client name -> backend name), as the upstream
# ensemble maps them (TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt;
# names, dtypes and dims recorded in tests/facts/trtllm_1_2_1/model_templates.json and checked there).
RUNTIME_INPUTS: tuple[PassThrough, ...] = (
    PassThrough("stream", "streaming", "TYPE_BOOL"),
    PassThrough("return_perf_metrics", "return_perf_metrics", "TYPE_BOOL"),
    PassThrough("top_k", "runtime_top_k", "TYPE_INT32"),
    PassThrough("top_p", "runtime_top_p", "TYPE_FP32"),
    PassThrough("temperature", "temperature", "TYPE_FP32"),
    PassThrough("seed", "seed", "TYPE_UINT64"),  # the backend reads `seed` (utils.h InputFieldsNames, r25.12 on)
    PassThrough("repetition_penalty", "repetition_penalty", "TYPE_FP32"),
    PassThrough("presence_penalty", "presence_penalty", "TYPE_FP32"),
    PassThrough("frequency_penalty", "frequency_penalty", "TYPE_FP32"),
    PassThrough("min_tokens", "min_tokens", "TYPE_INT32"),
    PassThrough("exclude_input_in_output", "exclude_input_in_output", "TYPE_BOOL"),
    PassThrough("return_log_probs", "return_log_probs", "TYPE_BOOL"),
    PassThrough("return_context_logits", "return_context_logits", "TYPE_BOOL"),
    PassThrough("return_generation_logits", "return_generation_logits", "TYPE_BOOL"),
    PassThrough("num_return_sequences", "num_return_sequences", "TYPE_INT32"),
    PassThrough("beam_width", "beam_width", "TYPE_INT32"),
    # guided decoding (structured output): the guide's type and text (trtpipe_runtime.grammar.GUIDE_TYPES)
    PassThrough("guided_decoding_guide_type", "guided_decoding_guide_type", "TYPE_STRING"),
    PassThrough("guided_decoding_guide", "guided_decoding_guide", "TYPE_STRING"),
    # the LoRA adapter of the request (0 or absent: the base model); the build's adapters have ids 1, 2, ...
    PassThrough("lora_task_id", "lora_task_id", "TYPE_UINT64"),
)
# Optional outputs of `tensorrt_llm` passed to the client as they are: log probs (return_log_probs), logits
# (return_context_logits / return_generation_logits), which sequence of num_return_sequences and which
# batch entry a response belongs to.
RUNTIME_OUTPUTS: tuple[PassThrough, ...] = (
    PassThrough("sequence_index", "sequence_index", "TYPE_INT32"),
    PassThrough("batch_index", "batch_index", "TYPE_INT32"),
    PassThrough("cum_log_probs", "cum_log_probs", "TYPE_FP32", "[ -1 ]"),
    PassThrough("output_log_probs", "output_log_probs", "TYPE_FP32", "[ -1, -1 ]"),
    PassThrough("context_logits", "context_logits", "TYPE_FP32", "[ -1, -1 ]"),
    PassThrough("generation_logits", "generation_logits", "TYPE_FP32", "[ -1, -1, -1 ]"),
)
# The outputs of a request with return_perf_metrics. The C++ backend writes all ten whenever the flag is
# set (model_instance_state.cc fillTritonResponse), and Triton fails the response on an output the config
# does not declare, so every one is declared, with the backend's dtypes (tests/facts/trtllm_1_2_1/perf_outputs.json).
PERF_OUTPUTS: tuple[PassThrough, ...] = tuple(PassThrough(n, n, t) for n, t in (
    ("kv_cache_alloc_new_blocks", "TYPE_INT32"), ("kv_cache_reused_blocks", "TYPE_INT32"),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32"),
    ("arrival_time_ns", "TYPE_INT64"), ("first_scheduled_time_ns", "TYPE_INT64"),
    ("first_token_time_ns", "TYPE_INT64"), ("last_token_time_ns", "TYPE_INT64"),
    ("acceptance_rate", "TYPE_FP32"), ("total_accepted_draft_tokens", "TYPE_INT32"),
    ("total_draft_tokens", "TYPE_INT32")))
PASS_OUTPUTS = RUNTIME_OUTPUTS + PERF_OUTPUTS
# This project's log-probability tensors, beyond upstream's interface (as num_output_tokens is): declared on the
# runtimes whose `tensorrt_llm` model reads them (plugins.runtimes.Runtime.log_prob_tensors) and carried by the
# ensemble and tensorrt_llm_bls. num_top_logprobs k (0 ... 20) gives, per new token, the k most likely tokens and
# their log probabilities (top_log_probs / top_token_ids [beam, tokens, k], most likely first, from the
# distribution output_log_probs scores); return_prompt_log_probs gives each prompt token's log probability after
# the first (prompt_log_probs [prompt - 1]) and, with k, its alternatives (prompt_top_* [prompt - 1, k]), with the
# request's first response. The C++ backend reads no such input (tests/facts/trtllm_1_2_1/inputs_read.json):
# its repository does not declare them, so Triton refuses a request that sends them.
LOG_PROB_INPUTS: tuple[PassThrough, ...] = (
    PassThrough("num_top_logprobs", "num_top_logprobs", "TYPE_INT32"),
    PassThrough("return_prompt_log_probs", "return_prompt_log_probs", "TYPE_BOOL"),
)
LOG_PROB_OUTPUTS: tuple[PassThrough, ...] = (
    PassThrough("top_log_probs", "top_log_probs", "TYPE_FP32", "[ -1, -1, -1 ]"),
    PassThrough("top_token_ids", "top_token_ids", "TYPE_INT32", "[ -1, -1, -1 ]"),
    PassThrough("prompt_log_probs", "prompt_log_probs", "TYPE_FP32", "[ -1 ]"),
    PassThrough("prompt_top_log_probs", "prompt_top_log_probs", "TYPE_FP32", "[ -1, -1 ]"),
    PassThrough("prompt_top_token_ids", "prompt_top_token_ids", "TYPE_INT32", "[ -1, -1 ]"),
)
# tensorrt_llm_bls's own output, on every runtime: the token ids of the text each response carries (the ids the log
# probabilities score: the tensors above, or the C++ backend's output_log_probs; the ensemble hands output_ids to
# postprocessing and has no such output). Sent when a client asks for it by name. The OpenAI frontend builds its
# `logprobs` from these ids with the tokenizer.
BLS_OUTPUTS: tuple[PassThrough, ...] = (PassThrough("output_token_ids", "output_token_ids", "TYPE_INT32", "[ -1 ]"),)


def runtime_inputs(runtime) -> tuple[PassThrough, ...]:
    """The optional inputs the `tensorrt_llm` model of ``runtime`` (plugins.runtimes.Runtime) declares beyond the
    required ones, and the ensemble and tensorrt_llm_bls forward to it."""
    return RUNTIME_INPUTS + (LOG_PROB_INPUTS if runtime.log_prob_tensors else ())


def pass_outputs(runtime) -> tuple[PassThrough, ...]:
    """The outputs of the `tensorrt_llm` model of ``runtime`` passed to the client as they are."""
    return PASS_OUTPUTS + (LOG_PROB_OUTPUTS if runtime.log_prob_tensors else ())
EXCLUDE_INPUT_REASON = ("the backend's default (docs/model_config.md): a non-streaming response leads with the "
                        "prompt unless the request sends exclude_input_in_output true; streaming never does")


@dataclass
class ModelPlan:
    """One model folder: the template it comes from and the values with their sources."""

    name: str
    template: str
    values: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def set(self, key: str, value, source: str) -> None:
        if isinstance(value, bool):
            value = "true" if value else "false"
        self.values[key] = str(value)
        self.sources[key] = source


@dataclass
class RepositoryPlan:
    """Every model of the repository, what it holds and why."""

    models: list[ModelPlan]
    sys_path: list[str]
    files: dict[str, str] = field(default_factory=dict)
    """Further files by path inside the repository (the trtllm-llmapi model's ``llm_api_options.yaml``)."""

    def as_dict(self) -> dict:
        return {m.name: {k: {"value": m.values[k], "source": m.sources[k]} for k in m.values} for m in self.models}


class RepositoryError(StageError):
    """The spec, the built engine and the tokenizer disagree: every problem, each with field/value/rule/fix."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [f"model repository not written: {len(self.problems)} problem(s):"]
        lines += [f"  - {pr.render()}" for pr in self.problems]
        super().__init__("\n".join(lines))

    def codes(self) -> list[str]:
        return [pr.code for pr in self.problems]


def _engine_config(engine_dir: Path) -> dict:
    """The engine's own config, one source of truth: engine.json (pytorch/llmapi) or trtllm-build's
    config.json, normalised to {build_config, mapping, pretrained_config, version, format}."""
    if not (engine_dir / "engine.json").is_file() and (engine_dir / "config.json").is_file():
        cfg = json.loads((engine_dir / "config.json").read_text())
        if "build_config" in cfg:  # a trtllm-build engine: its config.json carries the limits
            return engine_facts(cfg)
    path = engine_dir / "engine.json"
    if not path.is_file():
        raise StageError(f"{engine_dir}: engine.json missing: the engine stage did not complete; rerun the build")
    cfg = json.loads(path.read_text())
    cfg.setdefault("file", "engine.json")
    return cfg


def _generation_ids(tokenizer_dir: Path) -> tuple[list[int], int]:
    gen_path = tokenizer_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    eos = gen.get("eos_token_id")
    end_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    if not end_ids:
        raise StageError(f"{gen_path}: no eos_token_id: generation would never stop. Add it to "
                         "generation_config.json of the source model")
    pad = gen.get("pad_token_id", end_ids[0])
    return [int(i) for i in end_ids], int(pad)


def default_sys_path() -> list[str]:
    """Folders the Python-backend stub needs on sys.path: this interpreter's site-packages."""
    return [sysconfig.get_paths()["purelib"]]


def _tokenizer_vocab(tokenizer_dir: Path, trust_remote_code: bool) -> int | None:
    """Number of token ids the tokenizer can produce (added tokens included), offline, loaded as the preprocessing
    model loads it (``trust_remote_code``: the spec's model.trust_remote_code); None if unreadable."""
    try:
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True,
                                                 trust_remote_code=trust_remote_code))
    except Exception:  # reported by the caller as "not offline-loadable"
        return None


def check_against_engine(build, engine: dict | None, tokenizer_dir: Path) -> list[Problem]:
    """Every way the built engine's own facts (its config) and the tokenizer disagree with the spec and its plan
    (all problems at once). Rules of the spec alone are builders.preflight's, checked before any stage.

    ``engine`` is None for a GPU-host bundle (the engine does not exist yet): the checks that need
    the built engine are skipped there and run by the bundle's script instead.
    """
    s = build.settings
    sv = s.serving
    bc = (engine or {}).get("build_config") or s.limits.as_dict()
    problems: list[Problem] = []

    def bad(field, value, rule, fix, code):
        problems.append(Problem(field, value, rule, fix, code))

    rebuild = "rebuild the engine (`trtpipe build`) so the repository and the engine come from the same spec"
    problems += triton_batch_problems(build, bc["max_batch_size"])
    for key in ENGINE_LIMIT_KEYS:
        want = getattr(s.limits, key, None)
        if want is not None and bc.get(key) is not None and want != bc[key]:
            bad(f"limits.{key}", want, f"the engine was built with {key} = {bc[key]} (preprocessing truncates "
                "and refuses prompts by the engine's limits)", rebuild, "limits_differ_from_engine")
    world = build.world_size
    mapping = (engine or {}).get("mapping") or {}
    eng_world = mapping.get("world_size") or (mapping.get("tp_size", 1) * mapping.get("pp_size", 1)
                                               if mapping else None)
    if eng_world is not None and eng_world != world:
        bad("parallelism", {"tp_size": s.parallelism.tp_size, "pp_size": s.parallelism.pp_size},
            f"world_size tp x pp = {world} but the engine was built for world_size {eng_world}", rebuild,
            "world_size_differs_from_engine")
    if build.runtime.builds_trt_engine:
        plugin = bc.get("plugin_config") or {}
        paged_ctx = plugin.get("use_paged_context_fmha")
        for key in ("enable_kv_cache_reuse", "enable_chunked_context"):
            if getattr(sv, key) and paged_ctx is False:
                bad(f"serving.{key}", True, "needs an engine built with use_paged_context_fmha (the engine's "
                    "build_config.plugin_config.use_paged_context_fmha is false)",
                    f"set serving.{key}: false, or rebuild (the plugin resolver enables paged context FMHA when "
                    f"serving.{key} is true)", "kv_reuse_without_paged_context_fmha")
        version = (engine or {}).get("version")
        if version and str(version) != TRTLLM_VERSION:
            bad("runtime", "trtllm", f"the engine was built by TensorRT-LLM {version}, the pinned serving version "
                f"is {TRTLLM_VERSION} (engines only run with the version that built them)",
                f"rebuild the engine with TensorRT-LLM {TRTLLM_VERSION}", "engine_version_mismatch")
    if not (tokenizer_dir / "tokenizer_config.json").is_file() and not (tokenizer_dir / "tokenizer.json").is_file():
        bad("model.source", str(tokenizer_dir), "no tokenizer files (tokenizer.json / tokenizer_config.json) in "
            "the tokenizer folder", "rebuild so the engine stage copies the tokenizer", "tokenizer_missing")
    else:
        vocab = _tokenizer_vocab(tokenizer_dir, build.model.trust_remote_code)
        eng_vocab = ((engine or {}).get("pretrained_config") or {}).get("vocab_size")
        if vocab is None:
            bad("model.source", str(tokenizer_dir), "the tokenizer does not load offline (local_files_only)",
                "copy every tokenizer file of the source model into the engine folder", "tokenizer_not_loadable")
        elif eng_vocab is not None and vocab > int(eng_vocab):
            bad("model.source", str(tokenizer_dir), f"the tokenizer has {vocab} ids but the engine's vocab_size is "
                f"{eng_vocab}: prompts could hold ids the engine has no embedding for",
                "use the tokenizer of the model the engine was built from", "tokenizer_vocab_above_engine")
    return problems


def plan_repository(build, target, plan: Plan | None, engine_dir: Path, *, engine: dict | None = None,
                    engine_built: bool = True, tokenizer_dir: Path | None = None,
                    sys_path: list[str] | None = None) -> RepositoryPlan:
    """Compute the repository plan for an engine, after checking the spec against it.

    Every limit comes from the build's one limits object (``build.settings.limits``, the plan's), and the
    KV pool from the plan; the engine's own facts are only checked against them.

    Args:
        build: :class:`builders.spec.ResolvedBuild`.
        target: :class:`plugins.targets.TargetProfile`.
        plan: the build's plan (builders.plan.Plan); None outside a build (the KV pool is then the
            CPU rule of plugins.runtimes.kv_slots).
        engine_dir: the engine folder the repository points at (holds the tokenizer for pytorch/llmapi).
        engine: the engine's facts as its stage recorded them (engine.json content, or a trtllm-build
            config.json as builders.engine_trtllm.engine_facts); default: read from ``engine_dir``.
        engine_built: False for a GPU-host bundle, whose engine does not exist yet (nothing is read).
        tokenizer_dir: tokenizer folder (default: ``engine_dir``).
        sys_path: site-packages folders for the Python models (default: this interpreter's).

    Raises:
        RepositoryError: the spec contradicts the engine or the tokenizer (every problem listed).
        StageError: the engine or tokenizer folder is incomplete.
    """
    s = build.settings
    lim = s.limits
    if engine_built and engine is None:
        engine = _engine_config(engine_dir)
    tokenizer_dir = tokenizer_dir or engine_dir
    problems = check_against_engine(build, engine if engine_built else None, tokenizer_dir)
    if problems:
        raise RepositoryError(problems)
    kv_pool_tokens = plan.memory.kv.capacity_tokens if plan is not None and target.kind == "gpu" else None
    end_ids, pad_id = _generation_ids(tokenizer_dir)
    limit_src = {k: f"spec: {build.where(f'limits.{k}')}" for k in type(lim).model_fields}
    tmbs = s.serving.triton_max_batch_size or lim.max_batch_size
    tmbs_src = ("spec: serving.triton_max_batch_size" if s.serving.triton_max_batch_size
                else limit_src["max_batch_size"])
    decoupled = build.decoupled
    dec_src = "spec: serving.decoupled" if s.serving.decoupled is not None else "spec: serving.streaming"

    def common(mp: ModelPlan) -> ModelPlan:
        mp.set("triton_max_batch_size", tmbs, tmbs_src)
        return mp

    pre = common(ModelPlan("preprocessing", "preprocessing"))
    pre.set("tokenizer_dir", tokenizer_dir.resolve(), "engine folder: tokenizer copied from the source model")
    remote = ("trust_remote_code", build.model.trust_remote_code, "spec: model.trust_remote_code (whether "
              "transformers may run the checkpoint's own code when it loads the tokenizer or the model)")
    pre.set(*remote)
    pre.set("add_special_tokens", True, "default: the tokenizer adds what its config asks for (BOS for Llama-3)")
    pre.set("max_input_len", lim.max_input_len, limit_src["max_input_len"])
    pre.set("max_seq_len", lim.max_seq_len, limit_src["max_seq_len"])
    pre.set("end_id", end_ids[0], f"tokenizer: generation_config.json eos_token_id {end_ids} (the first)")
    pre.set("stop_token_ids", ",".join(str(i) for i in end_ids[1:]),
            f"tokenizer: generation_config.json eos_token_id {end_ids} (the others: sent as one-token stop "
            "words unless the client sends its own end_id)")
    pre.set("pad_id", pad_id, "tokenizer: generation_config.json pad_token_id")
    pre.set("preprocessing_instance_count", s.serving.instance_counts.preprocessing,
            "spec: serving.instance_counts.preprocessing")

    post = common(ModelPlan("postprocessing", "postprocessing"))
    post.set("tokenizer_dir", tokenizer_dir.resolve(), "engine folder: tokenizer copied from the source model")
    post.set(*remote)
    post.set("skip_special_tokens", True, "default: chat markers such as <|im_end|> are not part of the answer")
    post.set("postprocessing_instance_count", s.serving.instance_counts.postprocessing,
             "spec: serving.instance_counts.postprocessing")

    if build.runtime.builds_trt_engine:
        llm = _plan_trtllm_model(build, target, engine_dir, limit_src, dec_src, tokenizer_dir, plan=plan)
    else:
        llm = _plan_python_llm_model(build, target, engine_dir, limit_src, dec_src, kv_pool_tokens)
        if not build.runtime.llm_api:  # the LLM API takes it from llm_api_options.yaml (builders.llmapi_options)
            llm.set(*remote)
    common(llm)

    rt = build.runtime
    ens = common(ModelPlan("ensemble", "ensemble"))
    _set_tensor_tables(ens, side="ensemble", prefix="ensemble_", runtime=rt)
    ens.set("ensemble_runtime_input_map", "\n".join(
        f'      input_map {{ key: "{p.runtime_name}" value: "{p.ensemble_name}" }}' for p in runtime_inputs(rt)),
        _INPUTS_SOURCE[rt.log_prob_tensors])
    ens.set("ensemble_runtime_output_map", "".join(
        f'\n      output_map {{ key: "{p.runtime_name}" value: "{p.ensemble_name}" }}' for p in pass_outputs(rt)),
        _OUTPUTS_SOURCE[rt.log_prob_tensors])

    bls = common(ModelPlan("tensorrt_llm_bls", "tensorrt_llm_bls"))
    _set_tensor_tables(bls, side="ensemble", runtime=rt, bls=True)
    bls.set("decoupled", decoupled, dec_src)
    bls.set("bls_instance_count", s.serving.instance_counts.tensorrt_llm_bls,
            "spec: serving.instance_counts.tensorrt_llm_bls")
    bls.set("runtime_input_names", ",".join(f"{p.ensemble_name}:{p.runtime_name}" for p in runtime_inputs(rt)),
            _INPUTS_SOURCE[rt.log_prob_tensors] + " (client name: tensorrt_llm name)")
    bls.set("runtime_output_names", ",".join(p.runtime_name for p in pass_outputs(rt)),
            _OUTPUTS_SOURCE[rt.log_prob_tensors])
    files = {}
    if build.runtime.llm_api:  # the options tensorrt_llm.LLM gets: one file for Triton and trtllm-serve
        from builders.llmapi_options import options_files

        files.update({f"tensorrt_llm/1/{name}": text
                      for name, text in options_files(build, plan, engine_dir).items()})  # lora_dir: engine_dir/lora
    return RepositoryPlan([ens, bls, pre, llm, post], sys_path if sys_path is not None else default_sys_path(), files)


_INPUTS_SOURCE = {False: "model_repo.generate.RUNTIME_INPUTS",
                  True: "model_repo.generate.RUNTIME_INPUTS + LOG_PROB_INPUTS (the runtime reads them)"}
_OUTPUTS_SOURCE = {False: "model_repo.generate.RUNTIME_OUTPUTS + PERF_OUTPUTS",
                   True: "model_repo.generate.RUNTIME_OUTPUTS + PERF_OUTPUTS + LOG_PROB_OUTPUTS"}


def _set_tensor_tables(mp: ModelPlan, *, side: str, runtime, prefix: str = "", reshape: bool = False,
                       bls: bool = False) -> None:
    """The optional inputs (:func:`runtime_inputs`) and pass-through outputs (:func:`pass_outputs`) of a model for
    ``runtime`` (plugins.runtimes.Runtime), under their client names (``side="ensemble"``: `ensemble`,
    `tensorrt_llm_bls`) or their backend names (``side="runtime"``: `tensorrt_llm`); ``reshape`` gives each input
    the C++ backend's scalar shape; ``bls`` adds tensorrt_llm_bls's own outputs (BLS_OUTPUTS, with the log-prob
    tensors, or the C++ backend's output_log_probs)."""
    def name(p: PassThrough) -> str:
        return p.ensemble_name if side == "ensemble" else p.runtime_name

    def shape(p: PassThrough) -> str:
        if not reshape:
            return ""
        # the C++ backend's config declares its STRING inputs (the guided-decoding guide) unreshaped and ragged
        # (utils.cc reads them as [batch, 1]; tests/facts/trtllm_1_2_1/guided_decoding.json)
        return " allow_ragged_batch: true" if p.data_type == "TYPE_STRING" else " reshape: { shape: [ ] }"

    ext = runtime.log_prob_tensors
    outputs = pass_outputs(runtime) + (BLS_OUTPUTS if bls else ())
    mp.set(f"{prefix}runtime_inputs", ",\n".join(
        f'  {{ name: "{name(p)}" data_type: {p.data_type} dims: {p.dims}{shape(p)} optional: true }}'
        for p in runtime_inputs(runtime)), _INPUTS_SOURCE[ext])
    mp.set(f"{prefix}runtime_outputs", "".join(
        f',\n  {{ name: "{name(p)}" data_type: {p.data_type} dims: {p.dims} }}' for p in outputs),
        _OUTPUTS_SOURCE[ext] + (" + BLS_OUTPUTS" if bls else ""))


def _plan_python_llm_model(build, target, engine_dir: Path, limit_src: dict, dec_src: str,
                           kv_pool_tokens: int | None = None) -> ModelPlan:
    """The Python-backend `tensorrt_llm` model (pytorch and trtllm-llmapi runtimes)."""
    s = build.settings
    lim = s.limits
    llm = ModelPlan("tensorrt_llm", build.runtime.template)
    llm.set("decoupled", build.decoupled, dec_src)
    llm.set("max_queue_delay_microseconds", s.serving.max_queue_delay_microseconds,
            "spec: serving.max_queue_delay_microseconds")
    llm.set("engine_dir", engine_dir.resolve(), "build: engine stage output")
    llm.set("runtime_dtype", target.runtime_dtype, f"target profile {target.name}: runtime_dtype")
    llm.set("device", target.device, f"target profile {target.name}: device")
    llm.set("engine_max_batch_size", lim.max_batch_size, limit_src["max_batch_size"])
    for key in ("max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width", "tokens_per_block"):
        llm.set(key, getattr(lim, key), limit_src[key])
    llm.set("max_tokens_in_paged_kv_cache", *kv_slots(lim.max_batch_size, lim.max_seq_len,
                                                      s.serving.max_tokens_in_paged_kv_cache, kv_pool_tokens))
    for name, value, reason in build.runtime.settings:
        llm.set(name, value, f"plan: runtime_settings.{name}: {reason}")
    for key in ("kv_cache_free_gpu_mem_fraction", "enable_kv_cache_reuse", "enable_chunked_context",
                "batch_scheduler_policy", "max_queue_size"):
        llm.set(key, getattr(s.serving, key), f"spec: serving.{key}")
    if build.runtime.llm_api:  # tensorrt_llm.LLM takes these from llm_api_options.yaml: show its values
        from builders.llmapi_options import llm_api_options

        kv = llm_api_options(build)["kv_cache_config"]
        llm.set("enable_kv_cache_reuse", kv["enable_block_reuse"], "llm_api_options.yaml kv_cache_config."
                "enable_block_reuse (spec: serving.enable_kv_cache_reuse, else the LLM API's default: on)")
        llm.set("max_tokens_in_paged_kv_cache", kv.get("max_tokens", ""), "llm_api_options.yaml kv_cache_config."
                "max_tokens (empty: the LLM API sizes the pool by free_gpu_memory_fraction)")
    llm.set("exclude_input_in_output", False, EXCLUDE_INPUT_REASON)
    llm.set("cancellation_check_period_ms", 100, "how often cancelled requests are looked for (backend default)")
    llm.set("guided_decoding_backend", s.serving.guided_decoding_backend or "",
            "spec: serving.guided_decoding_backend" + ("" if s.serving.guided_decoding_backend else
                                                       " (empty: guided decoding off)"))
    _set_tensor_tables(llm, side="runtime", runtime=build.runtime)
    return llm


def _plan_trtllm_model(build, target, engine_dir: Path, limit_src: dict, dec_src: str,
                       tokenizer_dir: Path | None = None, plan: Plan | None = None) -> ModelPlan:
    """The C++ `tensorrtllm`-backend model over a trtllm-build engine: every parameter explicit."""
    s = build.settings
    sv, lim = s.serving, s.limits
    world = build.world_size
    llm = ModelPlan("tensorrt_llm", build.runtime.template)
    llm.set("decoupled", build.decoupled, dec_src)
    llm.set("max_queue_delay_microseconds", sv.max_queue_delay_microseconds,
            "spec: serving.max_queue_delay_microseconds")
    llm.set("max_queue_size", sv.max_queue_size, "spec: serving.max_queue_size")
    llm.set("gpt_model_type", "inflight_fused_batching", "in-flight batching (the C++ backend's IFB mode)")
    llm.set("engine_dir", engine_dir, "build: trtllm-build output folder")
    for key in ("batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction", "enable_kv_cache_reuse",
                "enable_chunked_context"):
        llm.set(key, getattr(sv, key), f"spec: serving.{key}")
    tokens, kv_src = kv_slots(lim.max_batch_size, lim.max_seq_len, sv.max_tokens_in_paged_kv_cache)
    llm.set("max_tokens_in_paged_kv_cache", tokens, f"{kv_src}; the memory fraction still caps it")
    llm.set("kv_cache_host_memory_bytes", sv.kv_cache_host_memory_bytes or "",
            "spec: serving.kv_cache_host_memory_bytes" + ("" if sv.kv_cache_host_memory_bytes else
                                                         " (empty: no host KV tier, the backend's default)"))
    llm.set("exclude_input_in_output", False, EXCLUDE_INPUT_REASON)
    beams = lim.max_beam_width
    llm.set("decoding_mode", "beam_search" if beams > 1 else "top_k_top_p",
            f"{limit_src['max_beam_width']} = {beams}")
    llm.set("max_beam_width", beams, limit_src["max_beam_width"])
    gpn = s.parallelism.gpus_per_node or target.gpus_per_node
    local = min(world, gpn)
    llm.set("gpu_device_ids", ",".join(str(i) for i in range(local)),
            f"node-local CUDA ids 0..{local - 1}: each node runs min(world_size {world}, gpus_per_node {gpn}) ranks "
            "(WorldConfig refuses ids >= gpus_per_node)")
    llm.set("participant_ids", ",".join(str(i) for i in range(world)),
            f"leader mode: MPI ranks 0..{world - 1} run the engine")
    llm.set("cancellation_check_period_ms", 100, "how often cancelled requests are looked for (backend default)")
    llm.set("multi_block_mode", True, "TensorRT-LLM 1.x default: split long-context decode attention over blocks")
    llm.set("cuda_graph_mode", False, "backend default: CUDA graphs off (engine profiles already cover shapes)")
    llm.set("normalize_log_probs", False, "output_log_probs as OpenAI's logprobs are, log P(token | whole vocabulary): "
            "true (the backend's default) renormalises over the top-k / top-p set, so a greedy request (top_k 1) "
            "would score every token 0.0 (samplingTopKKernels.cu; tests/facts/trtllm_1_2_1/log_probs.json)")
    # Read with no fallback by getGuidedDecodingConfigFromParams (model_instance_state.cc): a missing key
    # fails the model's load. Empty values leave guided decoding off. The tokenizer-info file is written by
    # the engine stage (or the bundle) beside the tokenizer (builders/xgrammar_info.py write_beside_tokenizer).
    backend = sv.guided_decoding_backend
    if backend:
        tok_dir = (tokenizer_dir or engine_dir / "tokenizer").resolve()
        llm.set("tokenizer_dir", tok_dir, "the engine's tokenizer (engine stage), for guided decoding")
        llm.set("xgrammar_tokenizer_info_path", tok_dir / XGRAMMAR_INFO_NAME,
                "written by the engine stage as upstream's examples/generate_xgrammar_tokenizer_info.py does")
        llm.set("guided_decoding_backend", backend, "spec: serving.guided_decoding_backend")
    else:
        for key in ("tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend"):
            llm.set(key, "", "spec: serving.guided_decoding_backend null: guided decoding off (the backend reads "
                    "the key unconditionally)")
    _set_lora_parameters(llm, plan, engine_dir)
    _set_tensor_tables(llm, side="runtime", runtime=build.runtime, reshape=True)
    return llm


def _set_lora_parameters(llm: ModelPlan, plan: Plan | None, engine_dir: Path) -> None:
    """The C++ backend's LoRA cache parameters (keys in tests/facts/trtllm_1_2_1/backend_parameters.json), written
    only with ``lora.adapters``: ``lora_prefetch_dir`` (the engine's converted adapters, builders.lora_trtllm) and
    the cache sizes of builders.lora_trtllm.cache_parameters. Without adapters no key is written: a present
    ``lora_prefetch_dir`` is passed on even when empty."""
    lora = plan.lora if plan is not None else None
    if lora is None:
        llm.set("lora_parameters", "", "no lora.adapters: no LoRA cache parameters (the backend's defaults)")
        return
    from builders.lora_trtllm import cache_parameters, prefetch_dir_of

    params = {"lora_prefetch_dir": (str(prefetch_dir_of(engine_dir)), "engine stage (or the bundle's script): "
                                    "lora.adapters converted as hf_lora_convert.py does, one folder per task id")}
    params.update(cache_parameters(lora, plan.memory))
    for key, (value, source) in params.items():
        llm.set(key, value, source)
    llm.set("lora_parameters", "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}  # {src}\n' for k, (v, src) in params.items()),
        "builders.lora_trtllm (one line per parameter, each with its source)")


def render_config(mp: ModelPlan) -> str:
    """Fill a template's ``${key}`` and ``${key_source}`` placeholders; refuse any left unfilled."""
    template = (TEMPLATES / mp.template / "config.pbtxt").read_text()
    values = dict(mp.values)
    values.update({f"{k}_source": v for k, v in mp.sources.items()})
    text = string.Template(template).safe_substitute(values)
    if "${" in text:
        left = sorted(set(part.split("}")[0] for part in text.split("${")[1:]))
        raise StageError(f"{mp.name}/config.pbtxt: unfilled placeholders {left}: the repository plan "
                         "does not provide them (a template and the generator disagree)")
    return text


def parse_config(text: str, where: str) -> model_config_pb2.ModelConfig:
    """Parse config.pbtxt text with Triton's ModelConfig proto; raise StageError with the parser's message."""
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise StageError(f"{where}: not a valid Triton model config: {exc}") from exc


def check_ensemble(configs: dict[str, model_config_pb2.ModelConfig]) -> list[str]:
    """Problems in the ensemble's wiring: unknown models, or map keys that are not tensors of the step's model."""
    problems = []
    ens = configs.get("ensemble")
    if ens is None:
        return ["no ensemble model"]
    produced = {i.name for i in ens.input}
    for step in ens.ensemble_scheduling.step:
        sub = configs.get(step.model_name)
        if sub is None:
            problems.append(f"ensemble step names model '{step.model_name}' that the repository lacks")
            continue
        inputs = {i.name: i for i in sub.input}
        outputs = {o.name for o in sub.output}
        for key, value in step.input_map.items():
            if key not in inputs:
                problems.append(f"ensemble -> {step.model_name}: input_map key '{key}' is not an input")
            elif value not in produced and not inputs[key].optional:
                problems.append(f"ensemble -> {step.model_name}: '{value}' feeds required input '{key}' "
                                "but nothing earlier produces it")
        for key, value in step.output_map.items():
            if key not in outputs:
                problems.append(f"ensemble <- {step.model_name}: output_map key '{key}' is not an output")
            produced.add(value)
    for out in ens.output:
        if out.name not in produced:
            problems.append(f"ensemble output '{out.name}' is produced by no step")
    return problems


def write_repository(plan: RepositoryPlan, out_dir: Path, *, atomic: bool = True) -> dict[str, model_config_pb2.ModelConfig]:
    """Render, validate and write the repository into ``out_dir``.

    With ``atomic`` the folder is written under a temporary name and renamed when complete;
    without it ``out_dir`` must be an empty folder the caller makes atomic (a build stage).

    Returns:
        the parsed ModelConfig of each model.

    Raises:
        StageError: an unfilled placeholder, a config that does not parse, or a broken ensemble.
    """
    rendered = {mp.name: render_config(mp) for mp in plan.models}
    configs = {name: parse_config(text, f"{name}/config.pbtxt") for name, text in rendered.items()}
    problems = check_ensemble(configs)
    if problems:
        raise StageError("model repository is inconsistent:\n  - " + "\n  - ".join(problems))
    if atomic:
        with atomic_dir(out_dir, marker="repository_plan.json") as tmp:
            _write(plan, rendered, tmp)
    else:
        _write(plan, rendered, out_dir)
    return configs


def write_python_model(template: str, model_dir: Path, sys_path: list[str]) -> None:
    """A Python-backend model's files into ``model_dir``: the template's modules (``model.py`` and those it
    imports) and the support package into ``1/``, ``sys_path.json`` (the site-packages the bootstrap puts first)
    beside config.pbtxt."""
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    for module in sorted((TEMPLATES / template / "1").glob("*.py")):
        shutil.copyfile(module, version / module.name)
    (version / RUNTIME_PACKAGE.name).mkdir()
    for f in runtime_package_files():
        shutil.copyfile(f, version / RUNTIME_PACKAGE.name / f.name)
    (model_dir / "sys_path.json").write_text(json.dumps(sys_path) + "\n")


def _write(plan: RepositoryPlan, rendered: dict[str, str], tmp: Path) -> None:
    for mp in plan.models:
        mdir = tmp / mp.name
        (mdir / "1").mkdir(parents=True)
        (mdir / "config.pbtxt").write_text(rendered[mp.name])
        if (TEMPLATES / mp.template / "1" / "model.py").is_file():
            write_python_model(mp.template, mdir, plan.sys_path)
    for rel, text in plan.files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    (tmp / "repository_plan.json").write_text(json.dumps(plan.as_dict(), indent=2) + "\n")

