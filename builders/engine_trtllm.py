"""Engine for the ``trtllm`` runtime: ``trtllm-build`` (TensorRT-LLM 1.2.1) on a GPU host.

Three pieces, each testable alone:

* :func:`trtllm_build_argv` is a pure function from the resolved build limits and plugin
  decisions to the exact ``trtllm-build`` command line;
* :func:`run_trtllm_build` runs it as a subprocess, streams its log with a spinner and the
  elapsed time, and keeps the whole log in the engine folder;
* :func:`check_engine_output` refuses an output folder that lacks ``config.json`` or a
  ``rank{r}.engine``, or whose ``build_config`` limits differ from the plan's.

Flag names follow ``tensorrt_llm/commands/build.py`` and ``tensorrt_llm/plugin/plugin.py`` of
TensorRT-LLM 1.2 (facts recorded in tests/facts/trtllm_1_2_1/trtllm_build.json). Which
``trtllm-build`` runs, and which versions it reports, is a :class:`Toolchain` the caller passes
in; :func:`installed_toolchain` finds the one installed here (None where TensorRT-LLM is absent).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from builders.spec import ENGINE_LIMIT_KEYS as LIMIT_KEYS
from builders.spec import LimitsConfig
from plugins.errors import StageError
from plugins.runtimes import runtime

TRTLLM_VERSION = runtime("trtllm").tensorrt_llm.first_text
"""The TensorRT-LLM release this pipeline plans engines for (the last on PyPI with trtllm-build): the trtllm
runtime's first release (engines only run with the release that built them)."""
LOG_NAME = "trtllm-build.log"


@dataclass(frozen=True)
class Toolchain:
    """The ``trtllm-build`` to run and the versions it builds with.

    Attributes:
        executable: the command (program and leading arguments, e.g. ``[python, script]``).
        versions: ``{"tensorrt-llm": ..., "tensorrt": ...}``; they enter the engine's cache key and
            the version check.
        python: the interpreter that imports that TensorRT-LLM (the checkpoint conversion of AutoAWQ/AutoGPTQ
            sources, builders.prequant_trtllm); None: this one.
    """

    executable: tuple[str, ...]
    versions: dict = field(default_factory=dict)
    python: Optional[str] = None

    @property
    def tensorrt_llm(self) -> Optional[str]:
        return self.versions.get("tensorrt-llm")


def trtllm_build_argv(*, checkpoint_dir: Path, output_dir: Path, limits: LimitsConfig, plugins: Iterable,
                      world_size: int, gpus_available: int, timing_cache: Optional[Path] = None,
                      executable: Iterable[str] = ("trtllm-build",), log_level: str = "info", lora=None,
                      dtype: str = "float16") -> list[str]:
    """The ``trtllm-build`` command line for one engine.

    Args:
        checkpoint_dir: TensorRT-LLM checkpoint (config.json + rank*.safetensors).
        output_dir: where config.json + rank*.engine go.
        limits: the build limits; :data:`LIMIT_KEYS` become flags (tokens_per_block travels with the plugins);
            gather_context_logits adds ``--gather_context_logits --logits_dtype float32`` (the flags of
            tests/facts/trtllm_1_2_1/trtllm_build.json; builders.plan.LOGITS_DTYPE_BYTES says why float32).
        plugins: plugins.resolve.PluginDecision list (the plan's ``plugins``); implicit
            ones add nothing.
        world_size: tp x pp: engines to build.
        gpus_available: GPUs on the build host; ``--workers`` is ``min(world_size, gpus)``
            (trtllm-build itself caps workers at the CUDA device count).
        timing_cache: file read if present and written after the build (speeds up rebuilds).
        executable: the command to run (program and leading arguments).
        log_level: trtllm-build ``--log_level`` (does not change the engine).
        lora: the plan's LoRA adapters (builders.plan.LoraPlan; None: none): adds ``--lora_plugin <dtype>
            --lora_target_modules ... --max_lora_rank N`` (builders.lora_trtllm.build_flags).
        dtype: the build dtype (the LoRA plugin's dtype).
    """
    from builders.lora_trtllm import build_flags

    argv = [*executable, "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir)]
    for key, value in limits.engine_limits().items():
        argv += [f"--{key}", str(int(value))]
    if limits.gather_context_logits:  # float32: the dtype the repository declares for context_logits
        argv += ["--gather_context_logits", "--logits_dtype", "float32"]
    for decision in plugins:
        argv += decision.cli()
    argv += build_flags(lora, dtype)
    argv += ["--workers", str(max(1, min(world_size, gpus_available)))]
    if timing_cache is not None:
        argv += ["--input_timing_cache", str(timing_cache), "--output_timing_cache", str(timing_cache)]
    argv += ["--log_level", log_level]
    return argv


def installed_toolchain() -> Optional[Toolchain]:
    """``trtllm-build`` from PATH with the ``tensorrt_llm`` package importable, and the installed
    TensorRT-LLM and TensorRT versions; None when TensorRT-LLM is absent (then the build writes the
    GPU-host bundle)."""
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("tensorrt_llm") is None or not shutil.which("trtllm-build"):
        return None
    versions = {}
    for pkg in ("tensorrt-llm", "tensorrt"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return Toolchain((shutil.which("trtllm-build"),), versions)


def check_toolchain(toolchain: Toolchain) -> None:
    """Refuse a TensorRT-LLM other than :data:`TRTLLM_VERSION` (engines are not portable across versions)."""
    got = toolchain.tensorrt_llm
    if got != TRTLLM_VERSION:
        raise StageError(f"TensorRT-LLM {got} is installed, but this pipeline plans engines for {TRTLLM_VERSION} "
                         f"(the serving container must match the builder). Install it with "
                         f"`pip install tensorrt-llm=={TRTLLM_VERSION}` or use the NGC Triton TRT-LLM container "
                         "that ships it")


def gpu_names() -> list[str]:
    """Names of the visible NVIDIA GPUs (nvidia-smi, else torch.cuda); empty when there are none."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            res = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20)
            if res.returncode == 0:
                return [line.strip() for line in res.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # torch absent or no CUDA
        return []


def run_trtllm_build(argv: list[str], log_path: Path, *, progress: bool = True, env: dict | None = None) -> float:
    """Run ``argv``, stream its output, keep the full log in ``log_path``; return seconds taken.

    Raises:
        StageError: the program is missing or exits non-zero (the message carries the log's tail).
    """
    tail: deque[str] = deque(maxlen=40)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env)
    except OSError as exc:
        raise StageError(f"could not start {argv[0]}: {exc}") from exc
    status = _Status(progress, f"trtllm-build ({Path(argv[0]).name})")
    with open(log_path, "w") as log_file, status:
        log_file.write("$ " + " ".join(argv) + "\n")
        for line in proc.stdout:
            log_file.write(line)
            log_file.flush()
            tail.append(line.rstrip())
            status.line(line.rstrip())
        rc = proc.wait()
    took = time.perf_counter() - t0
    if rc != 0:
        raise StageError(f"trtllm-build failed (exit {rc}) after {took:.0f} s; full log: {log_path}\n  "
                         + "\n  ".join(list(tail)[-15:]))
    return took


class _Status:
    """A rich spinner with the elapsed time and the latest log line; plain lines when disabled."""

    def __init__(self, enabled: bool, title: str):
        self.enabled = enabled and sys.stderr.isatty()
        self.plain = enabled and not self.enabled
        self.title = title
        self._progress = None
        self._task = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.title)
        return self

    def line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(f"  {text}", markup=False, highlight=False)
            self._progress.update(self._task, description=f"{self.title}: {text[:80]}")
        elif self.plain:
            print(f"  {text}", file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False


def check_engine_output(engine_dir: Path, *, world_size: int, limits: LimitsConfig) -> dict:
    """Check a trtllm-build output folder against the plan; return its config.json.

    Raises:
        StageError: config.json or a rank engine is missing, or a limit differs from the plan.
    """
    cfg_path = engine_dir / "config.json"
    if not cfg_path.is_file():
        raise StageError(f"{engine_dir}: trtllm-build wrote no config.json (see {LOG_NAME})")
    cfg = json.loads(cfg_path.read_text())
    missing = [f"rank{r}.engine" for r in range(world_size) if not (engine_dir / f"rank{r}.engine").is_file()]
    if missing:
        raise StageError(f"{engine_dir}: missing {missing} for world_size {world_size} (see {LOG_NAME})")
    bc = cfg.get("build_config") or {}
    wrong = {k: (bc.get(k), v) for k, v in limits.engine_limits().items() if bc.get(k) != v}
    tpb = (bc.get("plugin_config") or {}).get("tokens_per_block")
    if tpb is not None and tpb != limits.tokens_per_block:
        wrong["tokens_per_block"] = (tpb, limits.tokens_per_block)
    if limits.gather_context_logits and not bc.get("gather_context_logits"):
        wrong["gather_context_logits"] = (bc.get("gather_context_logits"), True)
    if wrong:
        detail = ", ".join(f"{k}: engine {a} vs plan {b}" for k, (a, b) in wrong.items())
        raise StageError(f"{engine_dir}/config.json build_config differs from the plan ({detail}): trtllm-build "
                         "adjusted a limit; change limits in the spec to values the engine accepts")
    return cfg


def engine_facts(cfg: dict) -> dict:
    """A trtllm-build config.json as the repository generator reads engines: build_config (with
    tokens_per_block), mapping, pretrained_config, version, format, file."""
    bc = dict(cfg.get("build_config") or {})
    bc.setdefault("tokens_per_block", (bc.get("plugin_config") or {}).get("tokens_per_block"))
    pre = cfg.get("pretrained_config") or {}
    return {"build_config": bc, "mapping": pre.get("mapping") or {}, "pretrained_config": pre,
            "version": cfg.get("version"), "format": "trtllm-build", "file": "config.json"}


def build_trtllm_engine(*, ckpt_dir: Path, hf_dir: Path, out_dir: Path, limits: LimitsConfig, plugins: list,
                        world_size: int, timing_cache: Path, toolchain: Toolchain, progress: bool = True,
                        lora=None, dtype: str = "float16") -> dict:
    """Build the engine into ``out_dir`` (an empty folder), check it, add the tokenizer and, with ``lora``
    (builders.plan.LoraPlan), the adapters' prefetch folder ``out_dir/lora`` (builders.lora_trtllm); return stage
    facts (the engine's own config as :func:`engine_facts`, the command line, the toolchain)."""
    from builders.model_fetch import copy_tokenizer

    gpus = gpu_names()
    argv = trtllm_build_argv(checkpoint_dir=ckpt_dir, output_dir=out_dir, limits=limits,
                             plugins=plugins, world_size=world_size, gpus_available=max(1, len(gpus)),
                             timing_cache=timing_cache, executable=toolchain.executable, lora=lora, dtype=dtype)
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    took = run_trtllm_build(argv, out_dir / LOG_NAME, progress=progress)
    cfg = check_engine_output(out_dir, world_size=world_size, limits=limits)
    copy_tokenizer(hf_dir, out_dir / "tokenizer")
    from builders.xgrammar_info import write_beside_tokenizer

    write_beside_tokenizer(out_dir / "tokenizer", hf_dir)  # guided decoding (xgrammar_tokenizer_info_path)
    lora_facts = None
    if lora is not None:
        from builders import lora_trtllm as lt
        from builders.lora import adapters_of

        lora_facts = lt.write_prefetch_dir(adapters_of(lora), lt.prefetch_dir_of(out_dir), dtype)
    return {"argv": argv, "lora_prefetch": lora_facts, "build_s": round(took, 3), "gpus": gpus, "gpu_name": gpus[0] if gpus else None,
            "tensorrt_llm_version": toolchain.versions.get("tensorrt-llm"),
            "tensorrt_version": toolchain.versions.get("tensorrt"), "engine_version": cfg.get("version"),
            "world_size": world_size, "executable": list(toolchain.executable), **engine_facts(cfg)}
