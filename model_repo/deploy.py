"""Deployment files for a build: docker compose and Kubernetes manifests, as data then files.

:func:`plan_deployment` computes what the files hold (image, world size, GPUs per node, ports,
shared memory, the launch command) from the build and its target; :func:`write_deployment`
renders ``docker-compose.yaml`` and ``k8s/*.yaml`` into ``build/<name>/<target>/deploy/``.

* one node (tp x pp <= the target's GPUs per node): a Deployment + Service;
* more: a LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``, one pod per node, the leader runs
  mpirun over the group) + Service.

The image is the NVIDIA Triton TensorRT-LLM container matching the pinned TensorRT-LLM
(:data:`TRITON_TRTLLM_IMAGES`, from NVIDIA's Triton release compatibility matrix,
https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/introduction/compatibility.html).
When the pin has no row there the files require ``TRITON_TRTLLM_IMAGE`` to be set rather than
guessing a tag.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from builders.engine_trtllm import TRTLLM_VERSION

# TensorRT-LLM version -> nvcr.io/nvidia/tritonserver tag (the compatibility matrix's
# "Container Name: trtllm-python-py3" table). 1.2.x is not listed in the matrix as stored
# (its newest row, 25.12, ships 1.1.0): add the row once NVIDIA publishes it.
TRITON_TRTLLM_IMAGES = {
    "1.1.0": "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
    "1.0.0": "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3",
    "0.21.0": "nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3",
    "0.20.0": "nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3",
}
IMAGE_VAR = "TRITON_TRTLLM_IMAGE"
SHM_SIZE = "2g"  # >= 64 MB per Python-backend instance; the container default (64 MB) is too small
MOUNT = "/trtpipe"  # where the build folder is mounted inside the container


def triton_image(trtllm_version: str = TRTLLM_VERSION) -> str:
    """The image for ``trtllm_version``, or a compose/k8s variable that must be set when unknown."""
    return TRITON_TRTLLM_IMAGES.get(trtllm_version) or (
        f"${{{IMAGE_VAR}:?set {IMAGE_VAR} to the nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 tag that "
        f"ships TensorRT-LLM {trtllm_version} (NVIDIA's Triton compatibility matrix)}}")


@dataclass(frozen=True)
class DeploymentPlan:
    """What the deployment files hold, and why."""

    name: str
    runtime: str
    image: str
    world_size: int
    gpus_per_node: int
    nodes: int
    http_port: int
    grpc_port: int
    metrics_port: int
    command: list[str]

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def plan_deployment(build, target) -> DeploymentPlan:
    """The deployment for ``build`` on ``target`` (inside the container: repository at /trtpipe/model_repo)."""
    from builders.bundle_trtllm import serve_argv

    s = build.settings
    world = s.parallelism.tp_size * s.parallelism.pp_size
    per_node = max(1, int(getattr(target, "gpus_per_node", 0) or 0)) if s.runtime == "trtllm" else max(1, world)
    per_node = min(per_node, world)
    nodes = -(-world // per_node)
    sv = s.serving
    repo = f"{MOUNT}/model_repo" if s.runtime != "trtllm" else f"{MOUNT}/bundle/model_repo"
    if s.runtime == "trtllm":
        # The container listens on all interfaces: the pod/compose network is the boundary.
        cmd = serve_argv(world, repo, http_port=sv.http_port, grpc_port=sv.grpc_port,
                         metrics_port=sv.metrics_port, address="0.0.0.0")
    else:
        cmd = ["tritonserver", f"--model-repository={repo}", "--http-address=0.0.0.0", "--grpc-address=0.0.0.0",
               "--metrics-address=0.0.0.0", f"--http-port={sv.http_port}", f"--grpc-port={sv.grpc_port}",
               f"--metrics-port={sv.metrics_port}", "--strict-readiness=true", "--exit-on-error=true"]
    return DeploymentPlan(build.name, s.runtime, triton_image(), world, per_node, nodes,
                          sv.http_port, sv.grpc_port, sv.metrics_port, cmd)


def compose(plan: DeploymentPlan) -> dict:
    """docker-compose.yaml for one host (the multi-node case is Kubernetes' LeaderWorkerSet)."""
    svc = {
        "image": plan.image,
        "command": ["bash", "-lc", " ".join(shlex.quote(a) for a in plan.command)],
        "shm_size": SHM_SIZE,
        "ulimits": {"memlock": -1, "stack": 67108864},
        "volumes": [f".:{MOUNT}:ro"],
        "ports": [f"127.0.0.1:{p}:{p}" for p in (plan.http_port, plan.grpc_port, plan.metrics_port)],
        "healthcheck": {"test": ["CMD", "curl", "-fsS", f"http://localhost:{plan.http_port}/v2/health/ready"],
                        "interval": "10s", "timeout": "5s", "retries": 60, "start_period": "60s"},
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": plan.gpus_per_node, "capabilities": ["gpu"]}]}}},
    }
    return {"name": plan.name, "services": {"triton": svc}}


def _container(plan: DeploymentPlan, command: list[str]) -> dict:
    return {
        "name": "triton", "image": plan.image, "command": command,
        "ports": [{"name": "http", "containerPort": plan.http_port}, {"name": "grpc", "containerPort": plan.grpc_port},
                  {"name": "metrics", "containerPort": plan.metrics_port}],
        "resources": {"limits": {"nvidia.com/gpu": plan.gpus_per_node}},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": plan.http_port},
                           "periodSeconds": 10, "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/v2/health/ready", "port": plan.http_port},
                         "periodSeconds": 10, "failureThreshold": 90},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": plan.http_port}, "periodSeconds": 15},
        "volumeMounts": [{"name": "build", "mountPath": MOUNT, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _volumes() -> list[dict]:
    return [{"name": "build", "persistentVolumeClaim": {"claimName": "trtpipe-build"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE.upper() + "i"}}]


def kubernetes(plan: DeploymentPlan) -> list[dict]:
    """Kubernetes objects: Deployment (one node) or LeaderWorkerSet (several), and a Service."""
    labels = {"app.kubernetes.io/name": plan.name, "app.kubernetes.io/part-of": "trtpipe"}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": plan.name, "labels": labels},
               "spec": {"selector": labels, "ports": [
                   {"name": n, "port": p, "targetPort": p} for n, p in
                   (("http", plan.http_port), ("grpc", plan.grpc_port), ("metrics", plan.metrics_port))]}}
    cmd = ["bash", "-lc", " ".join(shlex.quote(a) for a in plan.command)]
    if not plan.multi_node:
        pod = {"metadata": {"labels": labels}, "spec": {"containers": [_container(plan, cmd)], "volumes": _volumes()}}
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
                                  "spec": {"containers": [_container(plan, cmd)], "volumes": _volumes()}},
               "workerTemplate": {"spec": {"containers": [worker], "volumes": _volumes()}}}}}
    return [lws, service]


def write_deployment(plan: DeploymentPlan, out_dir: Path) -> list[Path]:
    """Write docker-compose.yaml and k8s/<kind>.yaml into ``out_dir``; return the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "k8s").mkdir(exist_ok=True)
    files = [out_dir / "docker-compose.yaml"]
    head = (f"# Generated by trtpipe for {plan.name} ({plan.runtime} runtime, world_size {plan.world_size}).\n"
            f"# Run from the build folder (it is mounted at {MOUNT}); see docs/deploy.md.\n")
    files[0].write_text(head + yaml.safe_dump(compose(plan), sort_keys=False))
    for obj in kubernetes(plan):
        path = out_dir / "k8s" / f"{obj['kind'].lower()}.yaml"
        path.write_text(head + yaml.safe_dump(obj, sort_keys=False))
        files.append(path)
    return files
