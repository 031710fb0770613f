"""Deployment files: compose for one host, Deployment+Service for one node, LeaderWorkerSet when
tp x pp needs more GPUs than a node has. Structural checks (required keys and types of the
compose spec and of each Kubernetes kind); kubernetes-validate checks the schemas when installed."""

from __future__ import annotations

import pytest
import yaml

from model_repo.deploy import IMAGE_VAR, kubernetes, plan_deployment, triton_image, write_deployment
from pipeline.fsutil import REPO_ROOT
from pipeline.spec import load_spec
from pipeline.targets import get_target
from tests.conftest import write_spec


def _check_k8s(obj):
    assert {"apiVersion", "kind", "metadata", "spec"} <= set(obj) and obj["metadata"]["name"]
    if obj["kind"] == "Deployment":
        spec = obj["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        containers = spec["template"]["spec"]["containers"]
    elif obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        assert lwt["size"] >= 2
        containers = lwt["leaderTemplate"]["spec"]["containers"] + lwt["workerTemplate"]["spec"]["containers"]
    else:
        assert obj["kind"] == "Service" and obj["spec"]["ports"]
        return
    for c in containers:
        assert c["name"] and c["image"] and isinstance(c["command"], list)
        assert isinstance(c["resources"]["limits"]["nvidia.com/gpu"], int)


def test_single_node_compose_and_deployment(tmp_path):
    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    plan = plan_deployment(build, get_target("cpu"))
    files = write_deployment(plan, tmp_path / "deploy")
    comp = yaml.safe_load(files[0].read_text())
    svc = comp["services"]["triton"]
    assert svc["shm_size"] and all(p.startswith("127.0.0.1:") for p in svc["ports"])
    assert "--model-repository=/trtpipe/model_repo" in svc["command"][-1]
    kinds = [yaml.safe_load(f.read_text())["kind"] for f in files[1:]]
    assert kinds == ["Deployment", "Service"]
    for f in files[1:]:
        _check_k8s(yaml.safe_load(f.read_text()))


def test_multi_node_uses_a_leader_worker_set_with_leader_mode_mpirun(tmp_path):
    build = load_spec(write_spec(tmp_path / "b.yaml", tmp_path, target="h100", runtime="trtllm",
                                 extra="    parallelism: {tp_size: 8, pp_size: 2}\n"), "h100")
    target = get_target("h100")
    plan = plan_deployment(build, target)
    assert plan.world_size == 16 and plan.nodes == 16 // target.gpus_per_node
    objs = kubernetes(plan)
    assert [o["kind"] for o in objs] == ["LeaderWorkerSet", "Service"]
    for o in objs:
        _check_k8s(o)
    cmd = plan.command
    assert cmd[0] == "mpirun" and cmd.count("tritonserver") == 16
    assert "--backend-config=python,shm-region-prefix-name=prefix15_" in cmd


def test_unknown_pin_requires_the_image_to_be_named():
    assert IMAGE_VAR in triton_image("9.9.9") and ":?" in triton_image("9.9.9")
    assert triton_image("1.1.0").endswith("25.12-trtllm-python-py3")


def test_manifests_pass_kubernetes_schemas(tmp_path):
    kv = pytest.importorskip("kubernetes_validate")
    build = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    for obj in kubernetes(plan_deployment(build, get_target("cpu"))):
        kv.validate(obj, "1.30", strict=True)
