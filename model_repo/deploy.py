"""Deployment files for a build: docker compose and Kubernetes manifests, as data then files.

:func:`plan_deployment` computes what the files hold (image, world size, GPUs per node, ports,
shared memory, where the build folder is mounted, the launch command) from the build, its target
and what the build produced; :func:`render_deployment` turns the plan into the text of
``docker-compose.yaml`` and ``k8s/*.yaml``; :func:`write_deployment` writes them into a folder
(the build's ``deploy`` stage writes ``build/<name>/<target>/deploy/`` atomically).

* one node (tp x pp <= the target's GPUs per node): a Deployment + Service;
* more: a LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``, one pod per node, the leader runs
  mpirun over the group) + Service.

The build folder is mounted inside the container **at the absolute path it had when it was
built**: every ``config.pbtxt`` names its engine/tokenizer folders by that path, so the
repository works unchanged wherever the folder was copied to on the host. What runs:

* ``model_repo``: tritonserver (leader-mode mpirun for the trtllm runtime) on ``model_repo/``;
* ``bundle`` (trtllm runtime built where TensorRT-LLM is not installed): the bundle's own
  ``build_and_serve.sh``, which builds the engine in the container on first start and serves it
  (the mount is writable for that).

A trtllm-llmapi build also gets the ``trtllm-serve`` alternative (TensorRT-LLM's OpenAI-compatible server
on the same checkpoint and LLM-API options): ``docker-compose.trtllm-serve.yaml``,
``k8s/trtllm-serve/{deployment,service}.yaml`` (a folder of its own, so ``kubectl apply -f k8s/``, which
does not recurse, starts Triton only), ``trtllm-serve.sh``; and upstream's Triton LLM-API model layout
``llmapi/tensorrt_llm/{config.pbtxt,1/model.yaml}`` (model_repo.upstream_llmapi).

The image is the NVIDIA Triton TensorRT-LLM container matching the pinned TensorRT-LLM
(:data:`TRITON_TRTLLM_IMAGES`, from NVIDIA's Triton release compatibility matrix). The portable
``pytorch`` runtime needs the project's own Python stack (transformers 5.24, numpy < 2), which no
published image carries: its files require ``TRTPIPE_IMAGE`` to be set rather than naming an
image that cannot serve it.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from builders.engine_trtllm import TRTLLM_VERSION
from builders.layout import build_dir
from builders.spec import default_port
from model_repo.bundle import SCRIPT_NAME
from model_repo.upstream_llmapi import config_pbtxt
from model_repo.launch import (FRONTEND_API_KEY_ENV, TRITON_ADMIN_APIS, TRITON_ADMIN_HEADER, TRITON_ADMIN_KEY_ENV,
                               TRTLLM_SERVE_HEALTH, TRTLLM_SERVE_OPTIONS_FILE, frontend_argv, server_argv,
                               trtllm_serve_argv)
from plugins.runtimes import Runtime, openai_server_releases
from trtpipe_runtime import versions

# TensorRT-LLM version -> nvcr.io/nvidia/tritonserver tag: the "Container Name: trtllm-python-py3"
# table of NVIDIA's Triton compatibility matrix, docs/introduction/compatibility.md of
# github.com/triton-inference-server/server (commit 0f963c9a8c6913aa4cd9b57ee04f9c2b76ee8d2a; published at
# https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html).
# 1.2.1 ships in 26.04, 26.05, 26.06 and 26.07 (all with TensorRT 10.14.1.48, so an engine built in one
# runs in the others); like the rows below, the newest container listed for a version is named.
TRITON_TRTLLM_IMAGES = {
    "1.2.1": "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3",
    "1.2.0": "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3",
    "1.1.0": "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
    "1.0.0": "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3",
    "0.21.0": "nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3",
    "0.20.0": "nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3",
}
IMAGE_VAR = "TRITON_TRTLLM_IMAGE"
PYTORCH_IMAGE_VAR = "TRTPIPE_IMAGE"
SHM_SIZE = "2g"  # >= 64 MB per Python-backend instance; the container default (64 MB) is too small
PVC_NAME = "trtpipe-build"  # the Kubernetes volume claim that holds the build folder
SECRET_KEYS = {TRITON_ADMIN_KEY_ENV: "triton-admin-key", FRONTEND_API_KEY_ENV: "openai-api-key"}
"""Environment variable -> its key in the build's Kubernetes Secret (:func:`secret_name`). The files name the
Secret, never a value: ``kubectl create secret`` (:func:`secret_command`) makes it; a pod waits until it exists."""
ADMIN_KEY_EXPANSION = (f"${{{TRITON_ADMIN_KEY_ENV}:?set {TRITON_ADMIN_KEY_ENV}, the key of the Triton "
                       f"{'/'.join(TRITON_ADMIN_APIS)} APIs: see docs/deploy.md}}")
"""What the generated Triton commands pass as the admin key: the container's shell fills it in from the environment
and refuses to start tritonserver without it (``${VAR:?message}``; the message holds no quote, which the shell would
read as one)."""


def secret_name(plan_name: str) -> str:
    """The Kubernetes Secret the build's pods read their keys from: ``<name>-keys``."""
    return f"{plan_name}-keys"


def secret_command(plan_name: str) -> str:
    """The ``kubectl create secret`` line that makes :func:`secret_name` with fresh random keys (the values never
    pass through a file or a manifest: ``openssl rand`` runs in the user's shell)."""
    keys = " ".join(f"--from-literal={k}=\"$(openssl rand -hex 32)\"" for k in SECRET_KEYS.values())
    return f"kubectl create secret generic {secret_name(plan_name)} {keys}"


def triton_image(trtllm_version: str = TRTLLM_VERSION) -> str:
    """The image for ``trtllm_version``, or a compose/k8s variable that must be set when unknown."""
    return TRITON_TRTLLM_IMAGES.get(trtllm_version) or (
        f"${{{IMAGE_VAR}:?set {IMAGE_VAR} to the nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 tag that "
        f"ships TensorRT-LLM {trtllm_version} (NVIDIA's Triton compatibility matrix)}}")


def project_image() -> str:
    """The image with this project's Python stack (the portable runtime, the OpenAI frontend): the user's, named by
    PYTORCH_IMAGE_VAR (compose's ``${VAR:?message}`` form)."""
    return (f"${{{PYTORCH_IMAGE_VAR}:?set {PYTORCH_IMAGE_VAR} to an image with tritonserver (Python backend) and "
            "this project's pinned Python packages (transformers 5.24, torch 2.13, numpy<2): the NGC TRT-LLM "
            "image does not carry them}")


def runtime_image(runtime: Runtime, trtllm_version: str = TRTLLM_VERSION) -> str:
    """The image a runtime is served from (its ``image`` trait; see the module docstring)."""
    return project_image() if runtime.image == "project" else triton_image(trtllm_version)


@dataclass(frozen=True)
class DeploymentPlan:
    """What the deployment files hold, and why (``reasons``: field -> where the value came from)."""

    name: str
    runtime: str
    image: str
    world_size: int
    gpus_per_node: int
    nodes: int
    gpu: bool
    http_port: int
    grpc_port: int
    metrics_port: int
    mount: str
    writable: bool
    served_from: str
    command: list[str]
    environment: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    trtllm_serve: list[str] = field(default_factory=list)
    """The ``trtllm-serve`` alternative to ``command`` (runtime trtllm-llmapi; empty for the others)."""
    openai: list[str] = field(default_factory=list)
    """The OpenAI-compatible frontend's command (pipeline.openai_frontend) beside tritonserver; empty: none."""
    openai_port: int = default_port("openai_port")
    frontend_image: str = ""
    """The project's image (the frontend needs this project's Python packages)."""
    later_options: dict = field(default_factory=dict)
    """Release -> options file for the later TensorRT-LLM releases that spell an option differently
    (builders.llmapi_options.options_files; empty when one file serves every release)."""
    upstream_model_yaml: dict = field(default_factory=dict)
    """``model.yaml`` for upstream's Triton LLM-API model (runtime trtllm-llmapi): the LLM-API options with ``model``,
    ``backend`` and ``triton_config`` (``max_batch_size``, ``decoupled``), as ``all_models/llmapi`` reads it
    (tests/facts/trtllm_1_2_1/triton_llmapi_model.json)."""

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def as_dict(self) -> dict:
        return asdict(self)


def plan_deployment(build, target, build_folder: Path | None = None, served_from: str | None = None) -> DeploymentPlan:
    """The deployment for ``build`` on ``target``.

    Args:
        build_folder: the build's output folder (default ``build/<name>/<target>``); mounted in the
            container at its absolute path.
        served_from: ``model_repo`` or ``bundle`` (default: ``bundle`` for the trtllm runtime when
            ``build_folder/bundle`` exists and ``build_folder/model_repo`` does not).
    """
    if build_folder is None:
        build_folder = build_dir(build)
    mount = str(Path(build_folder).resolve())
    s = build.settings
    rt = build.runtime
    mpi = rt.launcher == "mpirun"  # one rank per GPU, ranks spread over nodes
    if served_from is None:
        bundle_only = (Path(build_folder) / "bundle").is_dir() and not (Path(build_folder) / "model_repo").is_dir()
        served_from = "bundle" if rt.builds_trt_engine and bundle_only else "model_repo"
    world = build.world_size
    gpu = target.kind == "gpu"
    per_node = min(max(1, int(target.gpus_per_node)), world) if mpi else world
    nodes = -(-world // per_node)
    sv = s.serving
    env: dict = {}
    reasons = {
        "image": f"runtime {s.runtime}: " + ("the project's own image (TRTPIPE_IMAGE)" if rt.image == "project" else
                                             f"NGC Triton container shipping TensorRT-LLM {TRTLLM_VERSION}"),
        "mount": "the build folder's absolute path at build time: config.pbtxt files name folders by it",
        "gpus_per_node": (f"{s.runtime}: min(target {target.name} gpus_per_node {target.gpus_per_node}, world_size "
                          f"{world})" if mpi else f"{s.runtime}: one process holds all {world} rank(s)"),
    }
    if served_from == "bundle":
        # The bundle's script builds the engine inside the container (first start), then serves it.
        cmd = ["bash", f"{mount}/bundle/{SCRIPT_NAME}"]
        env = {"ADDRESS": "0.0.0.0", "HTTP_PORT": str(sv.http_port), "GRPC_PORT": str(sv.grpc_port),
               "METRICS_PORT": str(sv.metrics_port)}  # the script restricts Triton with TRITON_ADMIN_KEY
        reasons["command"] = "bundle/build_and_serve.sh: trtllm-build in the container on first start, then serve"
    else:
        # The container listens on all interfaces: the pod/compose network is the boundary.
        # Its admin APIs (model control, shared memory, trace, logging) behind a key the shell reads from the
        # environment (a Secret): nothing but the variable's name is written here.
        cmd = server_argv(rt.launcher, world, f"{mount}/model_repo", http_port=sv.http_port, grpc_port=sv.grpc_port,
                          metrics_port=sv.metrics_port, address="0.0.0.0", admin_key=ADMIN_KEY_EXPANSION)
        reasons["command"] = (f"leader-mode mpirun, one tritonserver rank per GPU (world_size {world})" if mpi else
                              "one tritonserver process on model_repo/")
    serve = trtllm_serve_argv(build, mount) if rt.openai_server == "trtllm-serve" else []
    upstream = {}
    if serve:
        from builders.llmapi_options import llm_api_options

        upstream = {"model": f"{mount}/engine", "backend": "pytorch",
                    **llm_api_options(build, engine_dir=Path(mount) / "engine"),  # lora_dir under the mount
                    "triton_config": {"max_batch_size": sv.triton_max_batch_size or s.limits.max_batch_size,
                                      "decoupled": build.decoupled}}
        reasons["trtllm_serve"] = ("trtllm-serve.sh: TensorRT-LLM's OpenAI server on the same checkpoint and LLM-API "
                                   "options as the Triton model")
    later = {}
    if serve:
        from builders.llmapi_options import RELEASES, options_file, options_files

        names = options_files(build)
        later = {r: f"{mount}/{TRTLLM_SERVE_OPTIONS_FILE.rsplit('/', 1)[0]}/{options_file(r)}"
                 for r in RELEASES[1:] if options_file(r) in names}
    repo = Path(build_folder) / ("bundle/model_repo" if served_from == "bundle" else "model_repo")
    lora = served_adapters(build, build_folder)
    openai = frontend_argv("python3", grpc_url=f"127.0.0.1:{sv.grpc_port}", model=build.name,
                           tokenizer=f"{mount}/{'bundle/tokenizer' if served_from == 'bundle' else 'engine'}",
                           max_input_len=s.limits.max_input_len, max_seq_len=s.limits.max_seq_len,
                           add_special_tokens=preprocessing_adds_special_tokens(repo), host="0.0.0.0",
                           port=sv.openai_port, trust_remote_code=preprocessing_trusts_remote_code(repo),
                           context_logits=s.limits.gather_context_logits,
                           adapters={a["name"]: a["task_id"] for a in lora},
                           adapter_paths={a["name"]: a["path"] for a in lora})
    reasons["openai"] = ("the OpenAI-compatible frontend beside tritonserver (the project's image): /v1 on "
                         f"serving.openai_port {sv.openai_port}, sending to the BLS model over 127.0.0.1 gRPC")
    return DeploymentPlan(build.name, s.runtime, runtime_image(rt), world, per_node, nodes, gpu,
                          sv.http_port, sv.grpc_port, sv.metrics_port, mount, served_from == "bundle",
                          served_from, cmd, env, reasons, trtllm_serve=serve, upstream_model_yaml=upstream,
                          openai=openai, openai_port=sv.openai_port,
                          frontend_image=project_image(), later_options=later)


OPENAI_PROFILE = "openai"
"""The compose profile of the OpenAI frontend where it needs an image other than Triton's (TRTPIPE_IMAGE):
``docker compose --profile openai up`` starts it too."""


def _preprocessing_flag(model_repository: Path, key: str) -> bool:
    """Whether the repository's preprocessing model has the string parameter ``key`` = "true"; False when the
    repository or the parameter is absent."""
    from model_repo.generate import parse_config

    path = Path(model_repository) / "preprocessing" / "config.pbtxt"
    if not path.is_file():
        return False
    pre = parse_config(path.read_text(), str(path))
    return key in pre.parameters and pre.parameters[key].string_value == "true"


def served_adapters(build, build_folder: Path) -> list[dict]:
    """The LoRA adapters ``build`` serves, as its plan.json in ``build_folder`` lists them (``lora.adapters``: each
    ``{"name", "task_id", "path", ...}``, task ids 1, 2, ...); empty without adapters.

    Raises:
        PipelineError: the build file lists adapters but plan.json is missing, unreadable or lists others (a
            folder built before they were added): rebuild it.
    """
    import json

    from plugins.errors import PipelineError

    wanted = list(build.settings.lora.adapters)
    path = Path(build_folder) / "plan.json"
    try:
        lora = (json.loads(path.read_text()) or {}).get("lora") if path.is_file() else None
    except (OSError, ValueError, AttributeError) as exc:
        raise PipelineError(f"{path}: unreadable ({exc}): rebuild with `trtpipe build {build.spec_path} --target "
                            f"{build.target}`") from exc
    adapters = sorted((lora or {}).get("adapters") or [], key=lambda a: a["task_id"])
    if [a["name"] for a in adapters] != wanted and wanted:
        raise PipelineError(f"{path} lists LoRA adapters {[a['name'] for a in adapters]}, the build file "
                            f"{wanted}: the folder was built before lora.adapters changed: rebuild with "
                            f"`trtpipe build {build.spec_path} --target {build.target}`")
    return adapters


def preprocessing_adds_special_tokens(model_repository: Path) -> bool:
    """The repository's preprocessing ``add_special_tokens`` parameter (how it counts prompt tokens); False when
    the repository or the parameter is absent."""
    return _preprocessing_flag(model_repository, "add_special_tokens")


def preprocessing_trusts_remote_code(model_repository: Path) -> bool:
    """The repository's preprocessing ``trust_remote_code`` parameter (the build file's model.trust_remote_code:
    the OpenAI frontend loads the tokenizer as preprocessing does); False when absent."""
    return _preprocessing_flag(model_repository, "trust_remote_code")


TRTLLM_SERVE_NAME = "trtllm-serve"
"""The compose service, container and Kubernetes name suffix of the trtllm-serve files."""


def _shell(command: list[str], compose_file: bool = False) -> list[str]:
    """``bash -lc <command>``: each argument quoted, those holding ``${...}`` in double quotes so that the
    container's shell expands them (the keys); in a compose file each ``$`` doubled, so that compose leaves it to
    that shell instead of filling it in from the host when it reads the file."""
    line = _line(command)
    return ["bash", "-lc", line.replace("$", "$$") if compose_file else line]


def _line(command: list[str]) -> str:
    """One shell line: each argument quoted, those holding ``${...}`` in double quotes (the shell expands them)."""
    return " ".join('"' + a + '"' if "${" in a else shlex.quote(a) for a in command)


def _key_environment(*names: str) -> dict:
    """compose ``environment`` entries that pass each variable through from the shell compose runs in (no value in
    the file: ``NAME:`` with null)."""
    return {n: None for n in names}


def _secret_env(plan: "DeploymentPlan", *names: str) -> list[dict]:
    """Kubernetes ``env`` entries that read each variable from the build's Secret (``secretKeyRef``; the pod does
    not start until the Secret exists: :func:`secret_command`)."""
    return [{"name": n, "valueFrom": {"secretKeyRef": {"name": secret_name(plan.name), "key": SECRET_KEYS[n]}}}
            for n in names]


def compose(plan: DeploymentPlan) -> dict:
    """docker-compose.yaml for one host (the multi-node case is Kubernetes' LeaderWorkerSet).

    The file lives in ``deploy/``: compose resolves ``..`` against the file's folder, so the build
    folder is what gets mounted whatever the working directory is.
    """
    svc = {
        "image": plan.image,
        "command": _shell(plan.command, compose_file=True),
        "shm_size": SHM_SIZE,
        "ulimits": {"memlock": -1, "stack": 67108864},
        "volumes": [f"..:{plan.mount}" + ("" if plan.writable else ":ro")],
        "ports": [f"127.0.0.1:{p}:{p}" for p in (plan.http_port, plan.grpc_port, plan.metrics_port)],
        "healthcheck": {"test": ["CMD", "curl", "-fsS", f"http://localhost:{plan.http_port}/v2/health/ready"],
                        "interval": "10s", "timeout": "5s", "retries": 60, "start_period": "60s"},
    }
    svc["environment"] = {**plan.environment, **_key_environment(TRITON_ADMIN_KEY_ENV)}
    if plan.gpu:
        svc["deploy"] = _gpu_reservation(plan)
    services = {"triton": svc}
    if plan.openai:  # shares triton's network namespace: gRPC on 127.0.0.1, its port published by triton
        svc["ports"].append(f"127.0.0.1:{plan.openai_port}:{plan.openai_port}")
        services["openai"] = {
            "image": plan.frontend_image, "command": _shell(plan.openai, compose_file=True),
            "environment": _key_environment(FRONTEND_API_KEY_ENV), "network_mode": "service:triton",
            "volumes": [f"..:{plan.mount}:ro"], "depends_on": {"triton": {"condition": "service_healthy"}},
            "healthcheck": {"test": ["CMD", "curl", "-fsS", f"http://localhost:{plan.openai_port}/health"],
                            "interval": "10s", "timeout": "5s", "retries": 30, "start_period": "20s"}}
        if plan.frontend_image != plan.image:  # another image (TRTPIPE_IMAGE): only with --profile openai
            services["openai"]["profiles"] = [OPENAI_PROFILE]
    return {"name": plan.name, "services": services}


def _gpu_reservation(plan: DeploymentPlan) -> dict:
    return {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "count": plan.gpus_per_node, "capabilities": ["gpu"]}]}}}


def compose_trtllm_serve(plan: DeploymentPlan) -> dict:
    """docker-compose.trtllm-serve.yaml: ``plan.trtllm_serve`` (host 0.0.0.0) in the same image, mount and GPUs as
    the Triton file, one HTTP port (``serving.http_port``) on the host's 127.0.0.1, healthy when ``GET /health``
    answers 200. A project of its own (``<name>-trtllm-serve``); it and docker-compose.yaml use the same port, so one
    runs at a time. Raises ValueError for a plan without trtllm-serve (runtime other than trtllm-llmapi)."""
    if not plan.trtllm_serve:
        raise ValueError(f"runtime {plan.runtime}: no trtllm-serve command (trtllm-llmapi builds only)")
    svc = {
        "image": plan.image,
        "command": _shell(plan.trtllm_serve, compose_file=True),
        "shm_size": SHM_SIZE,
        "ulimits": {"memlock": -1, "stack": 67108864},
        "volumes": [f"..:{plan.mount}:ro"],
        "ports": [f"127.0.0.1:{plan.http_port}:{plan.http_port}"],
        "healthcheck": {"test": ["CMD", "curl", "-fsS", f"http://localhost:{plan.http_port}{TRTLLM_SERVE_HEALTH}"],
                        "interval": "10s", "timeout": "5s", "retries": 60, "start_period": "60s"},
    }
    if plan.gpu:
        svc["deploy"] = _gpu_reservation(plan)
    return {"name": f"{plan.name}-{TRTLLM_SERVE_NAME}", "services": {TRTLLM_SERVE_NAME: svc}}


def _container(plan: DeploymentPlan, command: list[str]) -> dict:
    c = {
        "name": "triton", "image": plan.image, "command": command,
        "ports": [{"name": "http", "containerPort": plan.http_port}, {"name": "grpc", "containerPort": plan.grpc_port},
                  {"name": "metrics", "containerPort": plan.metrics_port}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": plan.http_port},
                           "periodSeconds": 10, "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/v2/health/ready", "port": plan.http_port},
                         "periodSeconds": 10, "failureThreshold": 90},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": plan.http_port}, "periodSeconds": 15},
        "volumeMounts": [{"name": "build", "mountPath": plan.mount, "readOnly": not plan.writable},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    c["env"] = [{"name": k, "value": v} for k, v in plan.environment.items()] + _secret_env(plan, TRITON_ADMIN_KEY_ENV)
    if plan.gpu:
        c["resources"] = {"limits": {"nvidia.com/gpu": plan.gpus_per_node}}
    if plan.runtime == "pytorch":  # its requests in flight end (with why) before the SIGTERM, so Triton exits cleanly
        c["lifecycle"] = {"preStop": {"exec": {"command": ["bash", "-c", PRE_STOP_DRAIN]}}}
    return c


PRE_STOP_DRAIN = ("touch /tmp/trtpipe-drain; for i in $(seq 80); do [ -e /tmp/trtpipe-drain.ack ] && break; sleep 0.1; "
                  "done")
"""The Triton container's preStop hook on the portable runtime: the generic drain file (trtpipe_runtime.lifeline
.drain_files, in /tmp), then up to 8 s for the runtime's acknowledgement."""


def _volumes() -> list[dict]:
    return [{"name": "build", "persistentVolumeClaim": {"claimName": PVC_NAME}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE.upper() + "i"}}]


def kubernetes(plan: DeploymentPlan) -> list[dict]:
    """Kubernetes objects: Deployment (one node) or LeaderWorkerSet (several), and a Service."""
    labels = {"app.kubernetes.io/name": plan.name, "app.kubernetes.io/part-of": "trtpipe"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": plan.name, "labels": labels},
               "spec": {"selector": labels, "ports": [
                   {"name": n, "port": p, "targetPort": p} for n, p in
                   (("http", plan.http_port), ("grpc", plan.grpc_port), ("metrics", plan.metrics_port))]}}
    cmd = _shell(plan.command)
    containers = [_container(plan, cmd)]
    if plan.openai and plan.frontend_image == plan.image:  # a sidecar in the pod's network (gRPC on 127.0.0.1);
        # only where Triton's image is the project's: an unset TRTPIPE_IMAGE would keep the pod from starting
        service["spec"]["ports"].append({"name": "openai", "port": plan.openai_port, "targetPort": plan.openai_port})
        containers.append({
            "name": "openai", "image": plan.frontend_image, "command": _shell(plan.openai),
            "env": _secret_env(plan, FRONTEND_API_KEY_ENV),
            "ports": [{"name": "openai", "containerPort": plan.openai_port}],
            "readinessProbe": {"httpGet": {"path": "/health", "port": plan.openai_port}, "periodSeconds": 10,
                               "failureThreshold": 3},
            "volumeMounts": [{"name": "build", "mountPath": plan.mount, "readOnly": True}]})
    if not plan.multi_node:
        pod = {"metadata": {"labels": labels}, "spec": {"containers": containers, "volumes": _volumes()}}
        dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": plan.name, "labels": labels},
               "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": pod}}
        return [dep, service]
    worker = _container(plan, ["bash", "-lc", "sleep infinity"])  # mpirun on the leader starts the ranks
    for key in ("readinessProbe", "startupProbe", "livenessProbe"):
        worker.pop(key)
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": plan.name, "labels": labels},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {
               "size": plan.nodes,
               "leaderTemplate": {"metadata": {"labels": labels},
                                  "spec": {"containers": containers, "volumes": _volumes()}},
               "workerTemplate": {"spec": {"containers": [worker], "volumes": _volumes()}}}}}
    return [lws, service]


def kubernetes_trtllm_serve(plan: DeploymentPlan) -> list[dict]:
    """Kubernetes objects for trtllm-serve: a Deployment (one pod, tp x pp GPUs; the llmapi runtime is one node)
    and a Service on ``serving.http_port``, probes on ``GET /health``. Named and labelled ``<name>-trtllm-serve``, so
    the Triton Service's selector does not pick its pod. Raises ValueError as :func:`compose_trtllm_serve`."""
    if not plan.trtllm_serve:
        raise ValueError(f"runtime {plan.runtime}: no trtllm-serve command (trtllm-llmapi builds only)")
    name = f"{plan.name}-{TRTLLM_SERVE_NAME}"
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "trtpipe"}

    def probe(period: int, **more) -> dict:
        return {"httpGet": {"path": TRTLLM_SERVE_HEALTH, "port": plan.http_port}, "periodSeconds": period, **more}

    c = {"name": TRTLLM_SERVE_NAME, "image": plan.image, "command": _shell(plan.trtllm_serve),
         "ports": [{"name": "http", "containerPort": plan.http_port}],
         "readinessProbe": probe(10, failureThreshold=3), "startupProbe": probe(10, failureThreshold=90),
         "livenessProbe": probe(15),
         "volumeMounts": [{"name": "build", "mountPath": plan.mount, "readOnly": True},
                          {"name": "dshm", "mountPath": "/dev/shm"}]}
    if plan.gpu:
        c["resources"] = {"limits": {"nvidia.com/gpu": plan.gpus_per_node}}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [c], "volumes": _volumes()}}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
           "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": plan.http_port,
                                                       "targetPort": plan.http_port}]}}
    return [dep, service]


def _head(plan: DeploymentPlan, serving: str, keys: str = "") -> str:
    return (f"# Generated by trtpipe for {plan.name} ({plan.runtime} runtime, world_size {plan.world_size}, "
            f"serving {serving}).\n"
            f"# The build folder is mounted at {plan.mount} (its path at build time); see docs/deploy.md.\n" + keys)


def _keys_compose() -> str:
    return (f"# Keys (no value is written here): export {TRITON_ADMIN_KEY_ENV} (Triton's "
            f"{', '.join(TRITON_ADMIN_APIS)} APIs: header {TRITON_ADMIN_HEADER}) and {FRONTEND_API_KEY_ENV} (the OpenAI "
            "frontend: Authorization: Bearer) first,\n# e.g. `export "
            f"{TRITON_ADMIN_KEY_ENV}=$(openssl rand -hex 32) {FRONTEND_API_KEY_ENV}=$(openssl rand -hex 32)`: "
            "tritonserver and the frontend refuse to start without them.\n")


def _keys_k8s(plan: DeploymentPlan) -> str:
    return (f"# Keys: from the Secret {secret_name(plan.name)} (no value is written here); create it once with\n"
            f"#   {secret_command(plan.name)}\n")


def render_deployment(plan: DeploymentPlan) -> dict[str, str]:
    """``{relative path: text}`` of every deployment file: docker-compose.yaml, k8s/<kind>.yaml; for trtllm-llmapi
    also README.md, docker-compose.trtllm-serve.yaml, k8s/trtllm-serve/<kind>.yaml, llmapi/tensorrt_llm/config.pbtxt
    and 1/model.yaml, trtllm-serve.sh."""
    head = _head(plan, f"{plan.served_from}/")
    files = {"docker-compose.yaml": head + _keys_compose() + yaml.safe_dump(compose(plan), sort_keys=False)}
    for obj in kubernetes(plan):
        files[f"k8s/{obj['kind'].lower()}.yaml"] = head + _keys_k8s(plan) + yaml.safe_dump(obj, sort_keys=False)
    if not plan.trtllm_serve:
        return files
    files["README.md"] = _llmapi_readme(plan)
    head = _head(plan, f"engine/ with {TRTLLM_SERVE_NAME}, the alternative to Triton: README.md")
    files[f"docker-compose.{TRTLLM_SERVE_NAME}.yaml"] = head + yaml.safe_dump(compose_trtllm_serve(plan),
                                                                             sort_keys=False)
    for obj in kubernetes_trtllm_serve(plan):
        files[f"k8s/{TRTLLM_SERVE_NAME}/{obj['kind'].lower()}.yaml"] = head + yaml.safe_dump(obj, sort_keys=False)
    if plan.upstream_model_yaml:
        files["llmapi/tensorrt_llm/config.pbtxt"] = config_pbtxt()
        files["llmapi/tensorrt_llm/1/model.yaml"] = (
            "# For upstream's Triton LLM-API model (TensorRT-LLM triton_backend/all_models/llmapi, see README.md): "
            "its model.py passes\n# every key but triton_config to tensorrt_llm.LLM. Generated by trtpipe.\n"
            + yaml.safe_dump(plan.upstream_model_yaml, sort_keys=False))
    files["trtllm-serve.sh"] = _trtllm_serve_script(plan)
    return files


def _trtllm_serve_script(plan: DeploymentPlan) -> str:
    """trtllm-serve.sh: checks the TensorRT-LLM version the container's python imports (release numbers only, so
    ``1.3.0rc5`` counts as 1.3.0) and picks the options file of that release, with trtpipe_runtime/versions.py's
    own text (the Triton model's code), then execs ``plan.trtllm_serve``."""
    least = _llmapi_least()
    later = " ".join(shlex.quote(f"{r}={path}") for r, path in plan.later_options.items())
    return f"""#!/usr/bin/env bash
# The same build served by TensorRT-LLM's OpenAI-compatible server instead of Triton (TensorRT-LLM {least} or later,
# in {plan.image}). Ready when GET {TRTLLM_SERVE_HEALTH} answers 200; the OpenAI API is under /v1.
# PYTHON: the interpreter trtllm-serve runs on (default python3); TRTPIPE_SKIP_VERSION_CHECK=1 skips the check.
set -euo pipefail
CONFIG={shlex.quote(plan.trtllm_serve[-1])}
# the options file of the installed release instead, where a later one spells speculative_config differently
CONFIG=$("${{PYTHON:-python3}}" - {least} "$CONFIG" {shlex.quote("run in " + plan.image)} {later} <<'PY'
{Path(versions.__file__).read_text()}PY
)
exec {" ".join(shlex.quote(a) for a in plan.trtllm_serve[:-1])} "$CONFIG"
"""


def _llmapi_least() -> str:
    """The oldest TensorRT-LLM the trtllm-serve files are written for (its runtime's ``tensorrt_llm`` releases)."""
    return openai_server_releases(TRTLLM_SERVE_NAME).first_text


def _llmapi_readme(plan: DeploymentPlan) -> str:
    """How to run a trtllm-llmapi build on a GPU host: the Triton command, the trtllm-serve one and upstream's Triton
    LLM-API model, exactly, with the files that run each."""
    triton = _line(plan.command)
    serve = " ".join(shlex.quote(a) for a in plan.trtllm_serve)
    least = _llmapi_least()
    ports = f"--http-port={plan.http_port} --grpc-port={plan.grpc_port} --metrics-port={plan.metrics_port}"
    later = "".join(f"\n\nTensorRT-LLM {r} and later spell an option of this build differently (speculative_config): "
                    f"they read `{path}` instead. The Triton model and `trtllm-serve.sh` pick the file of the "
                    "TensorRT-LLM they find; pass it to `--config` when you run trtllm-serve by hand."
                    for r, path in plan.later_options.items())
    return f"""# Serving {plan.name} ({plan.runtime}) on a GPU host

The build folder (`{plan.mount}`) holds ModelOpt's unified HF checkpoint (`engine/`) and the Triton repository
(`model_repo/`); the three ways below read the same LLM-API options, from
`{plan.mount}/model_repo/tensorrt_llm/1/llm_api_options.yaml` (upstream's model: a copy in its `model.yaml`). No
engine is built: TensorRT-LLM's PyTorch backend loads the checkpoint. It needs TensorRT-LLM {least} or later; the
image the compose and Kubernetes files use: `{plan.image}`.{later}

Check the version in the image first (`trtllm-serve.sh` does):

```bash
python3 -c "import tensorrt_llm; print(tensorrt_llm.__version__)"   # {least} or later
```

Mount the build folder at the same path inside the container (config.pbtxt names folders by it). Every way listens
on HTTP port {plan.http_port}: run one at a time.

## Triton (gRPC/HTTP, the ensemble with tokenization)

```bash
{triton}
```

Or, from this folder, `docker compose -f docker-compose.yaml up` / `kubectl apply -f k8s/` (same command; kubectl
does not descend into `k8s/{TRTLLM_SERVE_NAME}/`). Ready when `curl -s localhost:{plan.http_port}/v2/health/ready`
answers 200.

## trtllm-serve (OpenAI-compatible API)

```bash
{serve}
```

Or, from this folder, `./trtllm-serve.sh` (the version check, then the same command), `docker compose -f
docker-compose.{TRTLLM_SERVE_NAME}.yaml up` / `kubectl apply -f k8s/{TRTLLM_SERVE_NAME}/` (Deployment and Service
`{plan.name}-{TRTLLM_SERVE_NAME}`). Where TensorRT-LLM is installed, `trtpipe serve <build file> --target <target>
--server trtllm-serve` runs it on 127.0.0.1 and waits for `/health`. Ready when `curl -s
localhost:{plan.http_port}{TRTLLM_SERVE_HEALTH}` answers 200; then
`curl localhost:{plan.http_port}/v1/completions -H 'Content-Type: application/json' -d '{{"model": "{plan.mount}/engine", "prompt": "Hello", "max_tokens": 16}}'`.

## Triton with upstream's LLM-API model instead (text in, text out; no ensemble)

`llmapi/` here is upstream's `triton_backend/all_models/llmapi` layout: `tensorrt_llm/config.pbtxt` (upstream's
inputs and outputs) and `tensorrt_llm/1/model.yaml` (the LLM-API options with `model`, `backend` and
`triton_config`). Only upstream's Python code is missing: copy `model.py` and `helpers.py` from the TensorRT-LLM
checkout of the version in the image.

```bash
cp -R {plan.mount}/deploy/llmapi/ llmapi_repo/
cp <TensorRT-LLM checkout>/triton_backend/all_models/llmapi/tensorrt_llm/1/{{model.py,helpers.py}} llmapi_repo/tensorrt_llm/1/
tritonserver --model-repository=llmapi_repo/ {ports}
curl -X POST localhost:{plan.http_port}/v2/models/tensorrt_llm/generate -d '{{"text_input": "Hello", "sampling_param_max_tokens": 16}}'
```

Start tritonserver directly as above: model.py's `auto_complete_config` sets `max_batch_size` and `decoupled` from
`model.yaml`'s `triton_config` (config.pbtxt leaves them out, as upstream's does), and upstream's
`scripts/launch_triton_server.py` passes `--disable-auto-complete-config`, which leaves them at 0 and not
decoupled.
"""


def write_deployment(plan: DeploymentPlan, out_dir: Path) -> list[Path]:
    """Write docker-compose.yaml and k8s/<kind>.yaml into ``out_dir``; return the files (compose first).

    Not atomic by itself: the build's ``deploy`` stage calls it on a temporary folder that is renamed
    into place when complete.
    """
    out_dir = Path(out_dir)
    paths = []
    for rel, text in render_deployment(plan).items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    return paths
