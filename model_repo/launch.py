"""Every command line that starts a server, built by pure functions from the build and its plan.

One home for "how is X started?": ``trtpipe serve`` (pipeline.serve), the deployment files (model_repo.deploy:
docker compose, Kubernetes, trtllm-serve.sh), the GPU-host bundle's script (model_repo.bundle) and the Dynamo
graph (model_repo.dynamo) all take their commands from here; which one a build gets is its runtime's traits
(``launcher``, ``openai_server``). Nothing here starts a process or reads a file.

Sources: TensorRT-LLM 1.2.1's Triton backend ``triton_backend/scripts/launch_triton_server.py`` (leader-mode mpirun,
one ``tritonserver`` per rank, ``shm-region-prefix-name`` per rank, ranks other than 0 load only ``tensorrt_llm``,
``--disable-auto-complete-config``); ``tensorrt_llm/commands/serve.py`` of 1.2.1 and 1.4 (trtllm-serve's options,
tests/facts/trtllm_1_2_1/llm_args.json and tests/facts/trtllm_1_4/llm_args.json ``trtllm_serve``); Dynamo 1.6.1's
``dynamo/trtllm/backend_args.py`` and ``dynamo/frontend/frontend_args.py`` (tests/facts/dynamo_1_6_1).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

Port = Union[int, str]
"""A port number, or a shell variable (``"${HTTP_PORT}"``) where a script fills it in."""

TRTLLM_SERVE_OPTIONS_FILE = "model_repo/tensorrt_llm/1/llm_api_options.yaml"
"""The LLM-API options file both the Triton LLM-API model and ``trtllm-serve`` read (builders.llmapi_options),
relative to the build folder."""
TRTLLM_SERVE_HEALTH = "/health"
"""trtllm-serve's readiness route (200 once the model is loaded): ``trtllm_serve.health_path`` of
tests/facts/trtllm_1_2_1/llm_args.json and tests/facts/trtllm_1_4/llm_args.json (``serve/openai_server.py``)."""
FRONTEND_MODULE = "pipeline.openai_frontend"
"""The OpenAI-compatible frontend's entry point (``python -m``)."""
FRONTEND_API_KEY_ENV = "TRTPIPE_API_KEY"
"""The environment variable the OpenAI frontend reads its API key from (``--api-key`` overrides it; vLLM's server
reads VLLM_API_KEY the same way). The deployment files set it from a Kubernetes Secret / the compose host's
environment, never on a command line, where ``ps`` would show it."""

TRITON_ADMIN_APIS = ("model-repository", "shared-memory", "trace", "logging")
"""The Triton API groups the deployment files put behind a key: model load/unload and repository index, system and
CUDA shared-memory registration, trace and log settings. health, metadata, inference, model-config and statistics stay
open (probes, the OpenAI frontend and clients use them). Group names: tests/facts/tritonserver_2_51/
restricted_api.json (the binary's ``--help`` and docs/customization_guide/inference_protocols.md)."""
TRITON_ADMIN_HEADER = "admin-key"
"""The header that carries the key: HTTP ``admin-key: <value>``, gRPC metadata ``triton-grpc-protocol-admin-key``
(Triton prefixes the gRPC one: restricted_api.json ``grpc_header_prefix``)."""
TRITON_ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
"""The environment variable the generated commands read the key from (a Kubernetes Secret / the compose host)."""


def triton_restricted_argv(key: str, apis: Sequence[str] = TRITON_ADMIN_APIS,
                           header: str = TRITON_ADMIN_HEADER) -> list[str]:
    """``--http-restricted-api`` and ``--grpc-restricted-protocol`` for ``apis``, each
    ``<api>[,<api>...]:<header>=<key>`` (Triton's documented form; the binary's own help text shows a comma before
    the key, which it does not parse: tests/facts/tritonserver_2_51/restricted_api.json).

    ``key``: the value itself (a local server) or a shell expansion such as ``${TRITON_ADMIN_KEY:?...}`` that the
    container's shell fills in (the deployment files: no value is written into them). tritonserver takes the value
    on its command line only, so ``ps`` in the same container shows it. Raises ValueError on an empty key or one
    with a character the option's syntax reserves (``:``, ``=``, ``,``)."""
    shell = key.startswith("${") and key.endswith("}")  # filled in by the shell that runs the command
    if not key or (not shell and any(c in key for c in ":=,")):
        raise ValueError(f"Triton admin key {'(empty)' if not key else '(hidden)'}: must be non-empty without ':', "
                         "'=' or ',' (the --http-restricted-api syntax): use a random hex or base64url string, e.g. "
                         "`openssl rand -hex 32`")
    spec = f"{','.join(apis)}:{header}={key}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]


RESTRICTED_OPTIONS = ("--http-restricted-api=", "--grpc-restricted-protocol=")


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` fit for a log line: the key of each restriction option (:func:`triton_restricted_argv`) and the value
    of ``--api-key`` replaced by ``***``."""
    out, hide_next = [], False
    for a in argv:
        if hide_next:
            out.append("***")
        elif a.startswith(RESTRICTED_OPTIONS) and "=" in a.split("=", 1)[1]:
            out.append(a.rsplit("=", 1)[0] + "=***")
        elif a.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(a)
        hide_next = a == "--api-key"
    return out


def tritonserver_argv(model_repository: str, *, http_port: Port, grpc_port: Port, metrics_port: Port,
                      address: str = "127.0.0.1", tritonserver: str = "tritonserver",
                      backend_directory: Optional[str] = None, log_info: bool = False,
                      extra: Sequence[str] = (), admin_key: Optional[str] = None) -> list[str]:
    """One ``tritonserver`` process on ``model_repository``, listening on ``address``.

    ``--strict-readiness`` (ready only when every model is), ``--exit-on-error`` (a model that fails to load stops
    the server) and ``--disable-auto-complete-config``, as TensorRT-LLM's ``launch_triton_server.py`` passes: the
    generated configs are complete, and with auto-complete on the Python backend starts a stub per model only to ask
    it (python_be.cc ``LaunchAutoCompleteStubProcess``). ``backend_directory``: the wheel's backends (a local
    server); ``log_info``: INFO lines in the log (what ``trtpipe serve`` diagnoses from); ``admin_key``: put
    :data:`TRITON_ADMIN_APIS` behind this key (:func:`triton_restricted_argv`).
    """
    return [tritonserver, f"--model-repository={model_repository}",
            *([f"--backend-directory={backend_directory}"] if backend_directory else []),
            f"--http-address={address}", f"--http-port={http_port}",
            f"--grpc-address={address}", f"--grpc-port={grpc_port}",
            f"--metrics-address={address}", f"--metrics-port={metrics_port}",
            "--allow-metrics=true", "--strict-readiness=true", "--exit-on-error=true",
            "--disable-auto-complete-config", *(["--log-info=true"] if log_info else []),
            *(triton_restricted_argv(admin_key) if admin_key else []), *extra]


def leader_mode_argv(world_size: int, model_repo: str, *, http_port: Port, grpc_port: Port, metrics_port: Port,
                     address: str = "127.0.0.1", tritonserver: str = "tritonserver",
                     llm_model: str = "tensorrt_llm", admin_key: Optional[str] = None) -> list[str]:
    """The ``mpirun`` launcher: ``mpirun -n 1 tritonserver ... : -n 1 tritonserver ...``, one rank per GPU.

    Each rank gets its own Python-backend shared-memory prefix; ranks other than 0 load only the
    ``tensorrt_llm`` model (explicit model control), as TensorRT-LLM's ``launch_triton_server.py`` does.
    ``admin_key``: every rank puts :data:`TRITON_ADMIN_APIS` behind it (:func:`triton_restricted_argv`).
    """
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        argv += ["-n", "1", tritonserver, f"--model-repository={model_repo}"]
        if rank != 0:
            argv += ["--model-control-mode=explicit", f"--load-model={llm_model}"]
        argv += [f"--http-address={address}", f"--grpc-address={address}", f"--metrics-address={address}",
                 f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
                 "--disable-auto-complete-config",
                 f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
                 *(triton_restricted_argv(admin_key) if admin_key else [])]
        if rank != world_size - 1:
            argv.append(":")
    return argv


def server_argv(launcher: str, world_size: int, model_repository: str, *, http_port: Port, grpc_port: Port,
                metrics_port: Port, address: str = "127.0.0.1", tritonserver: str = "tritonserver",
                backend_directory: Optional[str] = None, log_info: bool = False,
                extra: Sequence[str] = (), admin_key: Optional[str] = None) -> list[str]:
    """Triton by the runtime's ``launcher`` trait (plugins.runtimes.Runtime): ``mpirun``, the leader-mode mpirun
    (one rank per GPU), else one process (:func:`tritonserver_argv`). ``admin_key``: as theirs."""
    ports = {"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port}
    if launcher == "mpirun":
        return leader_mode_argv(world_size, model_repository, address=address, tritonserver=tritonserver,
                                admin_key=admin_key, **ports)
    return tritonserver_argv(model_repository, address=address, tritonserver=tritonserver,
                             backend_directory=backend_directory, log_info=log_info, extra=extra,
                             admin_key=admin_key, **ports)


def trtllm_serve_argv(build, mount: str, host: str = "0.0.0.0", port: Optional[int] = None,
                      config: Optional[str] = None) -> list[str]:
    """``trtllm-serve serve <checkpoint> --host --port --config <options YAML>``: the OpenAI-compatible server of
    TensorRT-LLM over the build's unified HF checkpoint (the engine folder), with the options the Triton model uses.
    The deployment files, ``trtllm-serve.sh`` and ``trtpipe serve --server trtllm-serve`` all take it from here.

    Args:
        mount: the build folder (its absolute path at build time in the deployment files).
        host: the listen address.
        port: the HTTP port (default ``serving.http_port``).
        config: the options file (default ``<mount>/model_repo/tensorrt_llm/1/llm_api_options.yaml``).

    ``--config`` is the options file (``--extra_llm_api_options`` its older alias); the PyTorch backend is the
    default of both releases. Health: ``GET /health`` (200 when ready); OpenAI API under ``/v1``.
    """
    port = build.settings.serving.http_port if port is None else port
    return ["trtllm-serve", "serve", f"{mount}/engine", "--host", host, "--port", str(port),
            "--config", config or f"{mount}/{TRTLLM_SERVE_OPTIONS_FILE}"]


def frontend_argv(python: str, *, grpc_url: str, model: str, tokenizer: str, max_input_len: int, max_seq_len: int,
                  add_special_tokens: bool, host: str, port: int, triton_model: str = "tensorrt_llm_bls",
                  trust_remote_code: bool = False, context_logits: bool = False,
                  triton_pid: Optional[int] = None, adapters: Optional[Mapping[str, int]] = None,
                  adapter_paths: Optional[Mapping[str, str]] = None) -> list[str]:
    """The OpenAI-compatible frontend's command line (:data:`FRONTEND_MODULE`, whose parser takes exactly these
    options): ``trtpipe serve`` runs it beside tritonserver, the deployment files in a container of the project's
    image beside Triton's. ``context_logits``: the build's limits.gather_context_logits (``--context-logits``).
    ``triton_pid``: the local tritonserver's pid (``--triton-pid``: the frontend exits once that process has);
    None in the deployment files, where Triton runs in another container and ``/health`` answers 503 instead.
    ``adapters``: the build's LoRA adapters, name -> lora_task_id (plan.json ``lora.adapters``: ``--lora NAME=ID``
    each, in task-id order); ``adapter_paths``: name -> PEFT folder (``--lora-path NAME=PATH``)."""
    lora = sorted((adapters or {}).items(), key=lambda kv: kv[1])
    return [python, "-m", FRONTEND_MODULE, "--grpc-url", grpc_url, "--model", model, "--tokenizer",
            tokenizer, "--max-input-len", str(max_input_len), "--max-seq-len", str(max_seq_len), "--host", host,
            "--port", str(port), "--triton-model", triton_model, *(["--add-special-tokens"] if add_special_tokens
                                                                    else []),
            *(["--trust-remote-code"] if trust_remote_code else []), *(["--context-logits"] if context_logits else []),
            *(["--triton-pid", str(triton_pid)] if triton_pid else []),
            *(a for name, task in lora for a in ("--lora", f"{name}={task}")),
            *(a for name, _ in lora if name in (adapter_paths or {})
              for a in ("--lora-path", f"{name}={adapter_paths[name]}"))]


def dynamo_frontend_argv(http_port: int, router_mode: str) -> list[str]:
    """Dynamo's OpenAI frontend (``python3 -m dynamo.frontend``) on ``http_port`` with ``router_mode`` (kv,
    round-robin, random)."""
    return ["python3", "-m", "dynamo.frontend", "--http-port", str(http_port), "--router-mode", router_mode]


def dynamo_worker_argv(*, model_path: str, served_model_name: str, options_file: str, role: str,
                       publish_kv_events: bool) -> list[str]:
    """One Dynamo TensorRT-LLM worker (``python3 -m dynamo.trtllm``): the model, its served name, its LLM-API
    options file (``--extra-engine-args``) and its role (``--disaggregation-mode``: prefill, decode or
    prefill_and_decode); ``publish_kv_events`` for the KV-aware router, which scores workers on the blocks they
    report."""
    return ["python3", "-m", "dynamo.trtllm", "--model-path", model_path, "--served-model-name", served_model_name,
            "--extra-engine-args", options_file, "--disaggregation-mode", role,
            *(["--publish-kv-events"] if publish_kv_events else [])]
