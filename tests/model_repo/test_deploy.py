"""Deployment files: compose for one host, Deployment+Service for one node, LeaderWorkerSet when
tp x pp needs more GPUs than a node has; the bundle case runs the bundle's script.

Schemas: Kubernetes objects against the Kubernetes OpenAPI schemas (kubernetes-validate, the `test`
extra); the LeaderWorkerSet's pod templates the same way (as core PodTemplates) and its envelope
against :data:`LWS_SPEC`; docker-compose.yaml against the compose-spec JSON schema that
scripts/setup.sh installs into .schemas/. Each schema test also shows a broken file is rejected."""

from __future__ import annotations

import copy
import json
import os

import pytest
import yaml

from model_repo.deploy import (IMAGE_VAR, PYTORCH_IMAGE_VAR, compose, kubernetes, plan_deployment,
                               render_deployment, triton_image, write_deployment)
from builders.layout import build_dir
from pipeline.cli import main
from tests.conftest import REPO_ROOT
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import write_spec

DEFAULT = REPO_ROOT / "configs/builds/smollm2-135m.yaml"
K8S_VERSION = "1.30"
# docker-compose 1.29.2's copy of compose-spec/compose-spec schema/compose-spec.json (PyPI; scripts/setup.sh).
COMPOSE_SCHEMA = REPO_ROOT / ".schemas/docker-compose/compose/config/compose_spec.json"

# The LeaderWorkerSet envelope (everything but its two pod templates), written from the
# leaderworkerset.x-k8s.io/v1 API types (kubernetes-sigs/lws, api/leaderworkerset/v1/leaderworkerset_types.go):
# the fields each type declares, the required ones, the enums and the documented minimum group size.
# The CRD's full openAPIV3Schema ships in no package this project can install; the pod templates
# inside are core PodTemplateSpecs and are validated with the Kubernetes schemas instead.
LWS_SPEC = {
    "type": "object", "additionalProperties": False, "required": ["leaderWorkerTemplate"],
    "properties": {
        "replicas": {"type": "integer", "minimum": 0},
        "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
        "rolloutStrategy": {"type": "object"},
        "networkConfig": {"type": "object"},
        "leaderWorkerTemplate": {
            "type": "object", "additionalProperties": False, "required": ["workerTemplate"],
            "properties": {
                "leaderTemplate": {"type": "object"},
                "workerTemplate": {"type": "object"},
                "size": {"type": "integer", "minimum": 1},
                "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart",
                                           "None"]},
                "subGroupPolicy": {"type": "object"},
                "volumeClaimTemplates": {"type": "array"},
                "persistentVolumeClaimRetentionPolicy": {"type": "object"},
            }},
    }}


def _need(ok: bool, why: str) -> None:
    """Skip when a schema source is missing locally; in CI (setup.sh installs them) that is a failure."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI runs scripts/setup.sh, which installs it)")
        pytest.skip(why)


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


def _gpu_build(tmp_path, tp=1, pp=1, runtime="trtllm"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    extra = f"    parallelism: {{tp_size: {tp}, pp_size: {pp}}}\n"
    return load_spec(write_spec(tmp_path / "b.yaml", tmp_path, target="h100", runtime=runtime, extra=extra), "h100")


def test_single_node_compose_and_deployment(tmp_path):
    build = load_spec(DEFAULT, "cpu")
    folder = tmp_path / "build" / "smollm2" / "cpu"
    plan = plan_deployment(build, get_target("cpu"), folder)
    files = write_deployment(plan, tmp_path / "deploy")
    comp = yaml.safe_load(files[0].read_text())
    svc = comp["services"]["triton"]
    assert svc["shm_size"] and all(p.startswith("127.0.0.1:") for p in svc["ports"])
    # the build folder (`..` of deploy/) is mounted where it was built: config.pbtxt paths resolve
    mount = str(folder.resolve())
    assert svc["volumes"] == [f"..:{mount}:ro"]
    assert f"--model-repository={mount}/model_repo" in svc["command"][-1]
    assert "deploy" not in svc  # a cpu target asks for no GPU
    kinds = [yaml.safe_load(f.read_text())["kind"] for f in files[1:]]
    assert kinds == ["Deployment", "Service"]
    for f in files[1:]:
        _check_k8s(yaml.safe_load(f.read_text()))


def test_gpu_single_node_requests_its_gpus(tmp_path):
    plan = plan_deployment(_gpu_build(tmp_path, tp=2), get_target("h100"), tmp_path / "out")
    assert plan.gpus_per_node == 2 and plan.nodes == 1 and plan.served_from == "model_repo"
    devices = compose(plan)["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 2, "capabilities": ["gpu"]}]
    dep = kubernetes(plan)[0]
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert plan.command[0] == "mpirun" and plan.command.count("tritonserver") == 2


def test_multi_node_uses_a_leader_worker_set_with_leader_mode_mpirun(tmp_path):
    build = _gpu_build(tmp_path, tp=8, pp=2)
    target = get_target("h100")
    plan = plan_deployment(build, target, tmp_path / "out")
    assert plan.world_size == 16 and plan.nodes == 16 // target.gpus_per_node
    objs = kubernetes(plan)
    assert [o["kind"] for o in objs] == ["LeaderWorkerSet", "Service"]
    for o in objs:
        _check_k8s(o)
    cmd = plan.command
    assert cmd[0] == "mpirun" and cmd.count("tritonserver") == 16
    assert "--backend-config=python,shm-region-prefix-name=prefix15_" in cmd


def test_bundle_runs_its_script_on_a_writable_mount(tmp_path):
    folder = tmp_path / "out"
    (folder / "bundle").mkdir(parents=True)
    plan = plan_deployment(_gpu_build(tmp_path), get_target("h100"), folder)  # bundle/ only: detected
    assert plan.served_from == "bundle" and plan.writable
    svc = compose(plan)["services"]["triton"]
    assert svc["command"][-1] == f"bash {folder.resolve()}/bundle/build_and_serve.sh"
    assert svc["environment"]["ADDRESS"] == "0.0.0.0" and svc["volumes"] == [f"..:{folder.resolve()}"]
    container = kubernetes(plan)[0]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "ADDRESS", "value": "0.0.0.0"} in container["env"]
    assert container["volumeMounts"][0]["readOnly"] is False


def test_images_per_runtime():
    assert triton_image("1.2.1") == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert triton_image("1.1.0").endswith("25.12-trtllm-python-py3")
    assert IMAGE_VAR in triton_image("9.9.9") and ":?" in triton_image("9.9.9")


def test_pytorch_runtime_requires_an_image_with_the_project_stack(tmp_path):
    plan = plan_deployment(load_spec(DEFAULT, "cpu"), get_target("cpu"), tmp_path)
    assert plan.image.startswith(f"${{{PYTORCH_IMAGE_VAR}:?")
    plan = plan_deployment(_gpu_build(tmp_path, runtime="trtllm-llmapi"), get_target("h100"), tmp_path)
    assert plan.image == triton_image()


# ---- schemas ---------------------------------------------------------------------------------

def _all_k8s_objects(tmp_path):
    plans = [plan_deployment(load_spec(DEFAULT, "cpu"), get_target("cpu"), tmp_path / "a"),
             plan_deployment(_gpu_build(tmp_path / "b", tp=2), get_target("h100"), tmp_path / "b"),
             plan_deployment(_gpu_build(tmp_path / "c", tp=8, pp=2), get_target("h100"), tmp_path / "c")]
    return [obj for plan in plans for obj in kubernetes(plan)]


def _pod_template(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "lws-template"}, "template": template}


def _validate_k8s(kv, obj):
    if obj["kind"] == "LeaderWorkerSet":  # a CRD: the envelope against LWS_SPEC, the pod templates as PodTemplates
        import jsonschema

        jsonschema.validate(obj["spec"], LWS_SPEC)
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
            kv.validate(_pod_template(template), K8S_VERSION, strict=True)
    else:
        kv.validate(obj, K8S_VERSION, strict=True)


def test_manifests_pass_kubernetes_schemas(tmp_path):
    try:
        import kubernetes_validate as kv
    except ImportError:
        kv = None
    _need(kv is not None, "kubernetes-validate is not installed (pip install -e '.[test]')")
    objs = _all_k8s_objects(tmp_path)
    assert {o["kind"] for o in objs} == {"Deployment", "Service", "LeaderWorkerSet"}
    for obj in objs:
        _validate_k8s(kv, obj)


def test_kubernetes_schema_check_rejects_broken_manifests(tmp_path):
    try:
        import kubernetes_validate as kv
    except ImportError:
        kv = None
    _need(kv is not None, "kubernetes-validate is not installed (pip install -e '.[test]')")
    import jsonschema

    objs = {o["kind"]: o for o in _all_k8s_objects(tmp_path)}
    bad = copy.deepcopy(objs["Deployment"])
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kv.ValidationError):
        _validate_k8s(kv, bad)
    bad = copy.deepcopy(objs["Service"])
    bad["spec"]["ports"][0]["prot"] = 8000  # a typo: strict mode rejects unknown fields
    with pytest.raises(kv.ValidationError):
        _validate_k8s(kv, bad)
    bad = copy.deepcopy(objs["LeaderWorkerSet"])
    bad["spec"]["leaderWorkerTemplate"]["size"] = 0
    with pytest.raises(jsonschema.ValidationError):
        _validate_k8s(kv, bad)
    bad = copy.deepcopy(objs["LeaderWorkerSet"])
    bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["resources"] = {"limit": {}}
    with pytest.raises(kv.ValidationError):
        _validate_k8s(kv, bad)


def _compose_validator():
    _need(COMPOSE_SCHEMA.is_file(), f"{COMPOSE_SCHEMA} is missing: run scripts/setup.sh")
    import jsonschema

    schema = json.loads(COMPOSE_SCHEMA.read_text())
    return jsonschema.Draft201909Validator(schema)


def _validate_compose(validator, doc: dict) -> None:
    """The compose-spec schema of 2021 predates the top-level ``name`` (a string in today's spec):
    check that one key here, the rest against the schema."""
    doc = dict(doc)
    if "name" in doc:
        assert isinstance(doc.pop("name"), str)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    if errors:
        import jsonschema

        raise jsonschema.ValidationError("; ".join(f"{list(e.path)}: {e.message}" for e in errors))


def test_compose_files_pass_the_compose_spec_schema(tmp_path):
    validator = _compose_validator()
    folder = tmp_path / "b"
    (folder / "bundle").mkdir(parents=True)
    plans = [plan_deployment(load_spec(DEFAULT, "cpu"), get_target("cpu"), tmp_path / "a"),
             plan_deployment(_gpu_build(folder, tp=2), get_target("h100"), folder),
             plan_deployment(_gpu_build(tmp_path / "c", runtime="trtllm-llmapi"), get_target("h100"), tmp_path / "c")]
    assert {p.served_from for p in plans} == {"model_repo", "bundle"}
    for plan in plans:
        _validate_compose(validator, yaml.safe_load(render_deployment(plan)["docker-compose.yaml"]))


def test_compose_schema_check_rejects_broken_files(tmp_path):
    import jsonschema

    validator = _compose_validator()
    good = compose(plan_deployment(_gpu_build(tmp_path, tp=2), get_target("h100"), tmp_path))
    bad = copy.deepcopy(good)
    bad["services"]["triton"]["gpus_per_node"] = 2  # not a compose key
    with pytest.raises(jsonschema.ValidationError):
        _validate_compose(validator, bad)
    bad = copy.deepcopy(good)
    bad["services"]["triton"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] = [2]
    with pytest.raises(jsonschema.ValidationError):
        _validate_compose(validator, bad)


# ---- trtpipe deploy --------------------------------------------------------------------------

def test_deploy_command_refuses_a_build_that_does_not_exist(tmp_path, capsys):
    rc = main(["deploy", str(DEFAULT), "--target", "cpu", "--out", str(tmp_path)])
    assert rc == 2 and "build it first with `trtpipe build" in capsys.readouterr().err
    rc = main(["deploy", str(DEFAULT), "--target", "cpu", "--out", str(tmp_path), "--print"])
    assert rc == 2 and "is not built yet" in capsys.readouterr().err


def test_deploy_command_writes_records_and_prints(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))  # the build lock lives there
    build = load_spec(DEFAULT, "cpu")
    out = build_dir(build, tmp_path)
    (out / "model_repo").mkdir(parents=True)
    (out / "model_repo" / "stage.json").write_text('{"stage": "model_repo", "key": "k"}')
    (out / "manifest.json").write_text(json.dumps({"build": build.name, "stages": {"model_repo": {}}}))
    args = ["deploy", str(DEFAULT), "--target", "cpu", "--out", str(tmp_path)]

    assert main(args + ["--print"]) == 0
    printed = capsys.readouterr().out
    assert "# ---- deploy/docker-compose.yaml" in printed and "kind: Deployment" in printed
    assert not (out / "deploy").exists()  # --print writes nothing

    assert main(args) == 0
    assert "written" in capsys.readouterr().out
    assert (out / "deploy" / "docker-compose.yaml").is_file() and (out / "deploy" / "k8s" / "service.yaml").is_file()
    stage = json.loads((out / "manifest.json").read_text())["stages"]["deploy"]
    assert stage["info"]["files"] == ["docker-compose.yaml", "k8s/deployment.yaml", "k8s/service.yaml"]
    assert main(args) == 0 and "up to date" in capsys.readouterr().out
    assert not list(out.glob(".deploy.*"))  # written under a temporary name, renamed when complete


def test_llmapi_deployment_also_says_the_trtllm_serve_command(tmp_path):
    """trtllm-serve over the same checkpoint and LLM-API options file, with options both recorded releases take."""
    facts = {v: json.loads((REPO_ROOT / "tests" / "facts" / d / "llm_args.json").read_text())["trtllm_serve"]
             for v, d in (("1.2.1", "trtllm_1_2_1"), ("1.4", "trtllm_1_4"))}
    plan = plan_deployment(_gpu_build(tmp_path, tp=2, runtime="trtllm-llmapi"), get_target("h100"), tmp_path)
    argv = plan.trtllm_serve
    assert argv[:3] == ["trtllm-serve", "serve", f"{plan.mount}/engine"]
    flags = [a for a in argv[3:] if a.startswith("--")]
    for version, serve in facts.items():
        assert set(flags) <= set(serve["options"]), (version, set(flags) - set(serve["options"]))
    assert argv[argv.index("--config") + 1] == f"{plan.mount}/model_repo/tensorrt_llm/1/llm_api_options.yaml"
    assert argv[argv.index("--port") + 1] == str(plan.http_port)
    files = write_deployment(plan, tmp_path / "deploy")
    script = next(f for f in files if f.name == "trtllm-serve.sh").read_text()
    assert "exec trtllm-serve serve" in script and "/health" in script
    readme = next(f for f in files if f.name == "README.md").read_text()
    assert " ".join(plan.trtllm_serve) in readme and " ".join(plan.command) in readme and "1.2.1 or later" in readme
    # upstream's Triton LLM-API model (all_models/llmapi) reads model.yaml: the shipped keys, triton_config kept
    upstream = json.loads((REPO_ROOT / "tests" / "facts" / "trtllm_1_2_1" / "triton_llmapi_model.json").read_text())
    model_yaml = yaml.safe_load(next(f for f in files if f.name == "model.yaml").read_text())
    assert set(upstream["model_yaml"]) <= set(model_yaml) and model_yaml["model"] == f"{plan.mount}/engine"
    assert set(model_yaml["triton_config"]) <= set(upstream["model_py_reads"]["triton_config_keys_used"])
    assert model_yaml["tensor_parallel_size"] == 2 and model_yaml["triton_config"]["decoupled"] is True
    trt = plan_deployment(_gpu_build(tmp_path / "t", runtime="trtllm"), get_target("h100"), tmp_path / "t")
    assert trt.trtllm_serve == [] and not any(f.name == "trtllm-serve.sh" for f in write_deployment(trt, tmp_path / "d2"))
