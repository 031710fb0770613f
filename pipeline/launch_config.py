"""What a local launch beside tritonserver runs, checked before anything starts: trtllm-serve on a trtllm-llmapi
build (:func:`trtllm_serve_config`: the checkpoint, the options file of the installed release chosen by
trtpipe_runtime.versions, its keys) and the OpenAI frontend (:func:`frontend_launch`). Their command lines are
model_repo.launch's; starting, waiting and stopping are pipeline.serve's.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from builders.spec import default_port
from pipeline.server_failures import ServerError


TRTLLM_SERVE = "trtllm-serve"
"""The executable :class:`TrtllmServe` looks for on PATH."""


@dataclass
class TrtllmServeConfig:
    """How to launch trtllm-serve on one trtllm-llmapi build (made and checked by :func:`trtllm_serve_config`)."""

    argv: list[str]
    """``model_repo.launch.trtllm_serve_argv`` with this host's paths, address and port (``argv[0]``: trtllm-serve)."""
    checkpoint: Path
    """The unified HF checkpoint folder (the build's ``engine/``)."""
    options_file: Path
    """The LLM-API options YAML (``--config``)."""
    address: str = "127.0.0.1"
    http_port: int = default_port("http_port")
    log_file: Path | None = None
    ready_timeout_s: float = 600.0
    """Seconds to wait for ``/health`` to answer 200."""
    world_size: int = 1
    """GPUs it needs: the options' tensor_parallel_size x pipeline_parallel_size."""
    image: str = ""
    """The container image that ships the pinned TensorRT-LLM (``model_repo.deploy.runtime_image``)."""

    @property
    def health_url(self) -> str:
        """``GET`` here answers 200 once the model is loaded (model_repo.launch.TRTLLM_SERVE_HEALTH)."""
        from model_repo.launch import TRTLLM_SERVE_HEALTH

        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.address, self.address)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}{TRTLLM_SERVE_HEALTH}"


def installed_tensorrt_llm() -> str | None:
    """The installed TensorRT-LLM's version (package metadata; nothing is imported), or None."""
    from importlib import metadata

    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def trtllm_serve_config(build, folder: Path, *, address: str = "127.0.0.1", http_port: int | None = None,
                        ready_timeout_s: float = 600.0, model_repo: Path | None = None) -> TrtllmServeConfig:
    """The trtllm-serve launch of ``build`` from its build folder, after checking what can be checked without
    TensorRT-LLM: the runtime, the checkpoint's config.json, the options file (YAML mapping, every key one that
    TensorRT-LLM 1.2.1 and 1.4 accept: builders.llmapi_options.option_problems).

    Args:
        folder: the build folder (``build/<name>/<target>``).
        http_port: default ``serving.http_port``.
        model_repo: read the options from this repository's ``tensorrt_llm/1/llm_api_options.yaml`` instead of the
            build's (an edited copy).

    Raises:
        ServerError: the runtime is not trtllm-llmapi; the checkpoint or the options file is missing or unreadable.
        SpecError: the options file has a key a supported TensorRT-LLM release refuses.
    """
    from builders.llmapi_options import RELEASES, option_problems
    from builders.llmapi_options import options_file as options_file_for
    from model_repo.deploy import runtime_image
    from model_repo.launch import TRTLLM_SERVE_OPTIONS_FILE, trtllm_serve_argv
    from plugins.errors import SpecError
    from trtpipe_runtime.versions import options_file as choose_options_file

    spec = f"trtpipe build {build.spec_path} --target {build.target}"
    if build.runtime.openai_server != "trtllm-serve":
        raise ServerError(f"runtime {build.settings.runtime!r} of build {build.name} for {build.target}: --server "
                          "trtllm-serve serves trtllm-llmapi builds only (TensorRT-LLM's LLM API on the unified HF "
                          "checkpoint); serve it with --server triton, or build it with `" + spec + " --runtime "
                          "trtllm-llmapi` and serve that with --runtime trtllm-llmapi --server trtllm-serve")
    folder = Path(folder).resolve()
    checkpoint = folder / "engine"
    config_json = checkpoint / "config.json"
    try:
        if not isinstance(json.loads(config_json.read_text()), dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ServerError(f"{config_json}: no readable checkpoint config ({exc}); trtllm-serve loads the unified HF "
                          f"checkpoint from {checkpoint}: run `{spec}` first") from exc
    options_file = ((Path(model_repo).resolve() / TRTLLM_SERVE_OPTIONS_FILE.split("/", 1)[1]) if model_repo
                    else folder / TRTLLM_SERVE_OPTIONS_FILE)
    if options_file.parent.is_dir():  # a later release's own file where the build wrote one (speculative_config)
        options_file = Path(choose_options_file(str(options_file.parent), installed_tensorrt_llm()))
    import yaml

    try:
        options = yaml.safe_load(options_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ServerError(f"{options_file}: the LLM-API options file is missing or not YAML ({exc}): "
                          + ("pass a repository with tensorrt_llm/1/llm_api_options.yaml as --model-repo" if model_repo
                             else f"run `{spec}` (the model_repo stage writes it)")) from exc
    if not isinstance(options, dict):
        raise ServerError(f"{options_file}: holds a {type(options).__name__}, trtllm-serve's --config needs a mapping "
                          "of LLM-API options: regenerate it with `" + spec + "`")
    # the file serves every release unless a later one has its own (builders.llmapi_options.options_files)
    releases = ([r for r in RELEASES if r == RELEASES[0] or not (options_file.parent / options_file_for(r)).is_file()]
                if options_file.name == options_file_for(RELEASES[0]) else
                [r for r in RELEASES if options_file_for(r) == options_file.name])
    problems = option_problems(options, field="llm_api_options", releases=releases)
    if problems:
        raise SpecError(problems, str(options_file), what="the LLM-API options file")
    port = http_port or build.settings.serving.http_port
    argv = trtllm_serve_argv(build, str(folder), host=address, port=port, config=str(options_file))
    world = int(options.get("tensor_parallel_size") or 1) * int(options.get("pipeline_parallel_size") or 1)
    log_dir = Path(model_repo).resolve().parent if model_repo else folder  # beside the repository, as tritonserver's
    return TrtllmServeConfig(argv, checkpoint, options_file, address, port, log_dir / f"{TRTLLM_SERVE}.log",
                             ready_timeout_s, world, runtime_image(build.runtime))


@dataclass
class FrontendLaunch:
    """How to start the OpenAI-compatible frontend (pipeline.openai_frontend) beside a tritonserver."""

    grpc_url: str
    model: str
    tokenizer_dir: Path
    max_input_len: int
    max_seq_len: int
    add_special_tokens: bool
    address: str = "127.0.0.1"
    port: int = default_port("openai_port")
    log_file: Path | None = None
    ready_timeout_s: float = 120.0
    triton_model: str = "tensorrt_llm_bls"
    """The Triton model it sends to (pipeline.openai_frontend.FrontendConfig.triton_model)."""
    trust_remote_code: bool = False
    """Whether the tokenizer's own code may run (the repository's preprocessing ``trust_remote_code``)."""
    context_logits: bool = False
    """The engine returns context logits (the build's limits.gather_context_logits)."""
    triton_pid: int | None = None
    """The tritonserver it fronts (its process, or mpirun's): the frontend exits once that process has."""
    adapters: dict = field(default_factory=dict)
    """The build's LoRA adapters: name -> lora_task_id (model_repo.deploy.served_adapters)."""
    adapter_paths: dict = field(default_factory=dict)
    """Adapter name -> its PEFT folder."""

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def argv(self) -> list[str]:
        from model_repo.launch import frontend_argv

        return frontend_argv(sys.executable, grpc_url=self.grpc_url, model=self.model, tokenizer=str(self.tokenizer_dir),
                             max_input_len=self.max_input_len, max_seq_len=self.max_seq_len,
                             add_special_tokens=self.add_special_tokens, host=self.address, port=self.port,
                             triton_model=self.triton_model, trust_remote_code=self.trust_remote_code,
                             context_logits=self.context_logits, triton_pid=self.triton_pid,
                             adapters=self.adapters, adapter_paths=self.adapter_paths)


def frontend_launch(build, cfg, port: int, tokenizer_dir: Path, build_folder: Path | None = None) -> FrontendLaunch:
    """The frontend for ``build`` served by ``cfg`` (pipeline.serve.ServerConfig): its model id is the build name, its limits the build's,
    prompt tokens counted as the repository's preprocessing model counts them (``add_special_tokens``), and the
    build's LoRA adapters as its plan.json in ``build_folder`` lists them (default: the folder of
    ``tokenizer_dir``, the build's ``engine/``; model_repo.deploy.served_adapters, which raises PipelineError for a
    plan.json that does not list the build file's adapters)."""
    from model_repo.deploy import preprocessing_adds_special_tokens, preprocessing_trusts_remote_code, served_adapters

    special = preprocessing_adds_special_tokens(cfg.model_repository)
    lim = build.settings.limits
    lora = served_adapters(build, Path(build_folder) if build_folder is not None else Path(tokenizer_dir).parent)
    return FrontendLaunch(cfg.grpc_url, build.name, tokenizer_dir, lim.max_input_len, lim.max_seq_len, special,
                          cfg.address, port, cfg.model_repository.parent / "openai_frontend.log",
                          trust_remote_code=preprocessing_trusts_remote_code(cfg.model_repository),
                          context_logits=lim.gather_context_logits,
                          adapters={a["name"]: a["task_id"] for a in lora},
                          adapter_paths={a["name"]: a["path"] for a in lora})
