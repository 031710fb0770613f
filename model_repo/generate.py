"""Generate and validate the Triton model repository for a built engine.

Two steps, as data then action: :func:`plan_repository` computes every value each
``config.pbtxt`` will hold together with where it came from (a spec field, the engine's
own ``engine.json``/``config.json``, the tokenizer's ``generation_config.json``, or a
fixed choice with its reason); :func:`write_repository` renders the templates, refuses
any unfilled ``${...}``, parses each config with Triton's ``ModelConfig`` proto (from
tritonclient), checks that every ensemble step maps onto real inputs/outputs, and writes
the folder atomically.

Layout and tensor names follow the TensorRT-LLM backend's
``all_models/inflight_batcher_llm`` (see shared/reference/triton.md).
"""

from __future__ import annotations

import json
import string
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from pipeline.errors import StageError
from pipeline.fsutil import atomic_dir

TEMPLATES = Path(__file__).resolve().parent / "templates"
BOOTSTRAP_MARKER = "# @@BOOTSTRAP@@"


@dataclass(frozen=True)
class PassThrough:
    """An optional request input/output carried from the ensemble to the runtime model."""

    ensemble_name: str
    runtime_name: str
    data_type: str
    dims: str = "[ 1 ]"


# Optional ensemble inputs forwarded to `tensorrt_llm` (TensorRT-LLM's name mapping).
RUNTIME_INPUTS: tuple[PassThrough, ...] = (
    PassThrough("stream", "streaming", "TYPE_BOOL"),
    PassThrough("return_perf_metrics", "return_perf_metrics", "TYPE_BOOL"),
)
# Optional outputs returned by `tensorrt_llm` when return_perf_metrics is true (unix ns).
PERF_OUTPUTS: tuple[PassThrough, ...] = tuple(
    PassThrough(n, n, "TYPE_INT64") for n in
    ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"))


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

    def as_dict(self) -> dict:
        return {m.name: {k: {"value": m.values[k], "source": m.sources[k]} for k in m.values} for m in self.models}


def _engine_limits(engine_dir: Path) -> dict:
    path = engine_dir / "engine.json"
    if not path.is_file():
        raise StageError(f"{engine_dir}: engine.json missing: the engine stage did not complete; rerun the build")
    return json.loads(path.read_text())


def _generation_ids(tokenizer_dir: Path) -> tuple[list[int], int]:
    gen_path = tokenizer_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    eos = gen.get("eos_token_id")
    end_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    if not end_ids:
        raise StageError(f"{gen_path}: no eos_token_id: generation would never stop. Add it to "
                         "generation_config.json of the source model")
    pad = gen.get("pad_token_id", end_ids[0])
    return end_ids, int(pad)


def default_sys_path() -> list[str]:
    """Folders the Python-backend stub needs on sys.path: this interpreter's site-packages."""
    return [sysconfig.get_paths()["purelib"]]


def plan_repository(build, target, engine_dir: Path, *, tokenizer_dir: Path | None = None,
                    sys_path: list[str] | None = None) -> RepositoryPlan:
    """Compute the repository plan for a ``pytorch``-runtime engine.

    Args:
        build: :class:`pipeline.spec.ResolvedBuild`.
        target: :class:`pipeline.targets.TargetProfile`.
        engine_dir: built engine folder (holds engine.json and, for pytorch, the tokenizer).
        tokenizer_dir: tokenizer folder (default: ``engine_dir``).
        sys_path: site-packages folders for the Python models (default: this interpreter's).

    Raises:
        StageError: the engine or tokenizer folder is incomplete, or the spec contradicts the engine.
    """
    s = build.settings
    engine = _engine_limits(engine_dir)
    bc = engine["build_config"]
    tokenizer_dir = tokenizer_dir or engine_dir
    end_ids, pad_id = _generation_ids(tokenizer_dir)
    engine_src = f"engine: {engine_dir.name}/engine.json build_config"
    tmbs = s.serving.triton_max_batch_size or bc["max_batch_size"]
    tmbs_src = ("spec: serving.triton_max_batch_size" if s.serving.triton_max_batch_size
                else f"{engine_src}.max_batch_size")
    if tmbs > bc["max_batch_size"]:
        raise StageError(f"serving.triton_max_batch_size = {tmbs} exceeds the engine's max_batch_size "
                         f"{bc['max_batch_size']}: lower it or rebuild with a larger limits.max_batch_size")
    decoupled = s.serving.decoupled if s.serving.decoupled is not None else s.serving.streaming
    dec_src = "spec: serving.decoupled" if s.serving.decoupled is not None else "spec: serving.streaming"

    def common(mp: ModelPlan) -> ModelPlan:
        mp.set("triton_max_batch_size", tmbs, tmbs_src)
        return mp

    pre = common(ModelPlan("preprocessing", "preprocessing"))
    pre.set("tokenizer_dir", tokenizer_dir.resolve(), "engine folder: tokenizer copied from the source model")
    pre.set("add_special_tokens", True, "default: the tokenizer adds what its config asks for (BOS for Llama-3)")
    pre.set("max_input_len", bc["max_input_len"], f"{engine_src}.max_input_len")
    pre.set("max_seq_len", bc["max_seq_len"], f"{engine_src}.max_seq_len")
    pre.set("end_id", end_ids[0], f"tokenizer: generation_config.json eos_token_id {end_ids}")
    pre.set("pad_id", pad_id, "tokenizer: generation_config.json pad_token_id")
    pre.set("preprocessing_instance_count", s.serving.instance_counts.preprocessing,
            "spec: serving.instance_counts.preprocessing")

    post = common(ModelPlan("postprocessing", "postprocessing"))
    post.set("tokenizer_dir", tokenizer_dir.resolve(), "engine folder: tokenizer copied from the source model")
    post.set("skip_special_tokens", True, "default: chat markers such as <|im_end|> are not part of the answer")
    post.set("postprocessing_instance_count", s.serving.instance_counts.postprocessing,
             "spec: serving.instance_counts.postprocessing")

    llm = common(ModelPlan("tensorrt_llm", "tensorrt_llm_pytorch"))
    llm.set("decoupled", decoupled, dec_src)
    llm.set("max_queue_delay_microseconds", s.serving.max_queue_delay_microseconds,
            "spec: serving.max_queue_delay_microseconds")
    llm.set("engine_dir", engine_dir.resolve(), "build: engine stage output")
    llm.set("runtime_dtype", target.runtime_dtype, f"target profile {target.name}: runtime_dtype")
    llm.set("device", target.device, f"target profile {target.name}: device")
    llm.set("engine_max_batch_size", bc["max_batch_size"], f"{engine_src}.max_batch_size")
    for key in ("max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width", "tokens_per_block"):
        llm.set(key, bc[key], f"{engine_src}.{key}")
    kv = s.serving.max_tokens_in_paged_kv_cache
    llm.set("max_tokens_in_paged_kv_cache", kv if kv else bc["max_batch_size"] * bc["max_seq_len"],
            "spec: serving.max_tokens_in_paged_kv_cache" if kv else
            "plan: max_batch_size x max_seq_len (every slot can hold a full sequence)")
    for key in ("kv_cache_free_gpu_mem_fraction", "enable_kv_cache_reuse", "enable_chunked_context",
                "batch_scheduler_policy", "max_queue_size"):
        llm.set(key, getattr(s.serving, key), f"spec: serving.{key}")
    llm.set("runtime_inputs", ",\n".join(
        f'  {{ name: "{p.runtime_name}" data_type: {p.data_type} dims: {p.dims} optional: true }}'
        for p in RUNTIME_INPUTS), "model_repo.generate.RUNTIME_INPUTS")
    llm.set("runtime_outputs", "".join(
        f',\n  {{ name: "{p.runtime_name}" data_type: {p.data_type} dims: {p.dims} }}' for p in PERF_OUTPUTS),
        "model_repo.generate.PERF_OUTPUTS")

    ens = common(ModelPlan("ensemble", "ensemble"))
    ens.set("ensemble_runtime_inputs", ",\n".join(
        f'  {{ name: "{p.ensemble_name}" data_type: {p.data_type} dims: {p.dims} optional: true }}'
        for p in RUNTIME_INPUTS), "model_repo.generate.RUNTIME_INPUTS")
    ens.set("ensemble_runtime_outputs", "".join(
        f',\n  {{ name: "{p.ensemble_name}" data_type: {p.data_type} dims: {p.dims} }}' for p in PERF_OUTPUTS),
        "model_repo.generate.PERF_OUTPUTS")
    ens.set("ensemble_runtime_input_map", "\n".join(
        f'      input_map {{ key: "{p.runtime_name}" value: "{p.ensemble_name}" }}' for p in RUNTIME_INPUTS),
        "model_repo.generate.RUNTIME_INPUTS")
    ens.set("ensemble_runtime_output_map", "".join(
        f'\n      output_map {{ key: "{p.runtime_name}" value: "{p.ensemble_name}" }}' for p in PERF_OUTPUTS),
        "model_repo.generate.PERF_OUTPUTS")
    return RepositoryPlan([ens, pre, llm, post], sys_path if sys_path is not None else default_sys_path())


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


def render_model_py(template: str) -> str:
    """A model.py template with the sys.path bootstrap spliced in."""
    text = (TEMPLATES / template / "1" / "model.py").read_text()
    boot = (TEMPLATES / "_bootstrap.py").read_text()
    lines = text.splitlines(keepends=True)
    out = [boot if line.startswith(BOOTSTRAP_MARKER) else line for line in lines]
    return "".join(out)


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
        with atomic_dir(out_dir) as tmp:
            _write(plan, rendered, tmp)
    else:
        _write(plan, rendered, out_dir)
    return configs


def _write(plan: RepositoryPlan, rendered: dict[str, str], tmp: Path) -> None:
    for mp in plan.models:
        mdir = tmp / mp.name
        (mdir / "1").mkdir(parents=True)
        (mdir / "config.pbtxt").write_text(rendered[mp.name])
        if (TEMPLATES / mp.template / "1" / "model.py").is_file():
            (mdir / "1" / "model.py").write_text(render_model_py(mp.template))
            (mdir / "sys_path.json").write_text(json.dumps(plan.sys_path) + "\n")
    (tmp / "repository_plan.json").write_text(json.dumps(plan.as_dict(), indent=2) + "\n")

