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

from model_repo.deploy import (IMAGE_VAR, PYTORCH_IMAGE_VAR, compose, compose_trtllm_serve, kubernetes,
                               kubernetes_trtllm_serve, plan_deployment, render_deployment, triton_image,
                               write_deployment)
from model_repo.launch import trtllm_serve_argv
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
    """Fail (never skip) when a tool or schema is missing: `make setup` (scripts/setup.sh) installs every one."""
    if not ok:
        pytest.fail(f"{why} (`make setup` / `scripts/setup.sh --tools` installs it: run it)")


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
    llmapi = plan_deployment(_gpu_build(tmp_path / "d", tp=2, runtime="trtllm-llmapi"), get_target("h100"),
                             tmp_path / "d")
    return [obj for plan in plans for obj in kubernetes(plan)] + kubernetes_trtllm_serve(llmapi)


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
    _need(COMPOSE_SCHEMA.is_file(), f"{COMPOSE_SCHEMA} is missing: run scripts/setup.sh --tools")
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
    _validate_compose(validator, yaml.safe_load(render_deployment(plans[-1])["docker-compose.trtllm-serve.yaml"]))


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
    from model_repo.deploy import _line

    # the Triton command as a shell line: its admin-key argument double-quoted, for the shell to fill in
    assert " ".join(plan.trtllm_serve) in readme and _line(plan.command) in readme and "1.2.1 or later" in readme
    assert '"--http-restricted-api=' in readme and "${TRITON_ADMIN_KEY:?" in readme
    # upstream's Triton LLM-API model (all_models/llmapi) reads model.yaml: the shipped keys, triton_config kept
    upstream = json.loads((REPO_ROOT / "tests" / "facts" / "trtllm_1_2_1" / "triton_llmapi_model.json").read_text())
    model_yaml = yaml.safe_load(next(f for f in files if f.name == "model.yaml").read_text())
    assert set(upstream["model_yaml"]) <= set(model_yaml) and model_yaml["model"] == f"{plan.mount}/engine"
    assert set(model_yaml["triton_config"]) <= set(upstream["model_py_reads"]["triton_config_keys_used"])
    # model.py's auto_complete_config indexes both without a fallback: they set what config.pbtxt leaves out
    assert {"max_batch_size", "decoupled"} <= set(model_yaml["triton_config"])
    assert model_yaml["tensor_parallel_size"] == 2 and model_yaml["triton_config"]["decoupled"] is True
    trt = plan_deployment(_gpu_build(tmp_path / "t", runtime="trtllm"), get_target("h100"), tmp_path / "t")
    assert trt.trtllm_serve == [] and not any(f.name == "trtllm-serve.sh" for f in write_deployment(trt, tmp_path / "d2"))


def test_trtllm_serve_compose_and_kubernetes_match_the_triton_ones(tmp_path):
    """Same image, mount, GPUs and /dev/shm as Triton's files; the command is trtllm_serve_argv on 0.0.0.0 (the one
    source); one HTTP port; health on trtllm-serve's /health (facts: trtllm_serve.health_path)."""
    health = {json.loads((REPO_ROOT / "tests" / "facts" / d / "llm_args.json").read_text())["trtllm_serve"]["health_path"]
              for d in ("trtllm_1_2_1", "trtllm_1_4")}
    assert health == {"/health"}
    build = _gpu_build(tmp_path, tp=2, runtime="trtllm-llmapi")
    plan = plan_deployment(build, get_target("h100"), tmp_path / "out")
    mount = str((tmp_path / "out").resolve())
    argv = trtllm_serve_argv(build, mount, host="0.0.0.0")
    assert plan.trtllm_serve == argv

    triton = compose(plan)["services"]["triton"]
    doc = compose_trtllm_serve(plan)
    assert doc["name"] != compose(plan)["name"]  # its own compose project
    svc = doc["services"]["trtllm-serve"]
    assert svc["command"] == ["bash", "-lc", " ".join(argv)]
    for key in ("image", "shm_size", "ulimits", "volumes", "deploy"):
        assert svc[key] == triton[key], key
    assert svc["volumes"] == [f"..:{mount}:ro"]
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert svc["ports"] == [f"127.0.0.1:{plan.http_port}:{plan.http_port}"]
    assert svc["healthcheck"]["test"][-1] == f"http://localhost:{plan.http_port}/health"

    dep, service = kubernetes_trtllm_serve(plan)
    tdep, tservice = kubernetes(plan)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    tc = tdep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["bash", "-lc", " ".join(argv)] and c["image"] == tc["image"]
    assert c["resources"] == tc["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert c["volumeMounts"] == tc["volumeMounts"] and dep["spec"]["template"]["spec"]["volumes"] == \
        tdep["spec"]["template"]["spec"]["volumes"]
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": plan.http_port}, probe
    assert c["ports"] == [{"name": "http", "containerPort": plan.http_port}]
    assert service["spec"]["ports"] == [{"name": "http", "port": plan.http_port, "targetPort": plan.http_port}]
    # neither Service selects the other's pod
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    tpod_labels = tdep["spec"]["template"]["metadata"]["labels"]
    assert not tservice["spec"]["selector"].items() <= pod_labels.items()
    assert not service["spec"]["selector"].items() <= tpod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert dep["metadata"]["name"] == service["metadata"]["name"] == f"{plan.name}-trtllm-serve"

    files = render_deployment(plan)
    assert yaml.safe_load(files["docker-compose.trtllm-serve.yaml"]) == doc
    assert [yaml.safe_load(files[f"k8s/trtllm-serve/{k}.yaml"]) for k in ("deployment", "service")] == [dep, service]
    # `kubectl apply -f k8s/` does not recurse: Triton's objects only at the top
    assert sorted(k for k in files if k.startswith("k8s/") and k.count("/") == 1) == ["k8s/deployment.yaml",
                                                                                       "k8s/service.yaml"]
    readme = files["README.md"]
    assert "docker-compose.trtllm-serve.yaml" in readme and "kubectl apply -f k8s/trtllm-serve/" in readme
    # only trtllm-llmapi builds have a trtllm-serve command
    trt = plan_deployment(_gpu_build(tmp_path / "t"), get_target("h100"), tmp_path / "t")
    with pytest.raises(ValueError, match="runtime trtllm"):
        compose_trtllm_serve(trt)
    assert not any("trtllm-serve" in k for k in render_deployment(trt))


def test_trtllm_serve_script_checks_the_tensorrt_llm_version(tmp_path):
    """trtllm-serve.sh refuses a TensorRT-LLM older than 1.2.1 before it execs the command (a stand-in module
    answers tensorrt_llm.__version__; `exec trtllm-serve` is swapped for an echo)."""
    import subprocess
    import sys

    plan = plan_deployment(_gpu_build(tmp_path, runtime="trtllm-llmapi"), get_target("h100"), tmp_path / "out")
    script = render_deployment(plan)["trtllm-serve.sh"]
    assert script.rstrip().endswith("exec " + " ".join(plan.trtllm_serve[:-1]) + ' "$CONFIG"')
    assert f"CONFIG={plan.trtllm_serve[-1]}\n" in script and not plan.later_options  # one options file
    probe = script.replace("\nexec trtllm-serve", "\necho would run trtllm-serve")
    for version, ok in (("1.2.0", False), ("1.2.1", True), ("1.3.0rc5", True), ("1.4.0", True), ("0.21.0", False)):
        site = tmp_path / version
        site.mkdir()
        (site / "tensorrt_llm.py").write_text(f"__version__ = {version!r}\n")
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "PYTHON": sys.executable, "PYTHONPATH": str(site)})
        assert (r.returncode == 0) is ok, (version, r.stderr)
        assert ("would run trtllm-serve serve" in r.stdout) is ok
        if not ok:
            assert f"TensorRT-LLM {version} is older than 1.2.1" in r.stderr and plan.image in r.stderr


def test_trtllm_serve_script_takes_the_options_file_of_the_installed_release(tmp_path):
    """Speculative decoding is spelt differently by 1.2.1 and 1.4 (Eagle / Eagle3): the build writes a file per
    release and trtllm-serve.sh passes the one for the TensorRT-LLM it finds."""
    import subprocess
    import sys

    tmp_path.mkdir(parents=True, exist_ok=True)
    extra = "    serving:\n      speculative_decoding: {mode: eagle3, draft_model: /models/eagle3}\n"
    build = load_spec(write_spec(tmp_path / "b.yaml", tmp_path, target="h100", runtime="trtllm-llmapi", extra=extra),
                      "h100")
    plan = plan_deployment(build, get_target("h100"), tmp_path / "out")
    later = f"{plan.mount}/model_repo/tensorrt_llm/1/llm_api_options-1.4.yaml"
    assert plan.later_options == {"1.4": later}
    probe = render_deployment(plan)["trtllm-serve.sh"].replace("\nexec trtllm-serve", "\necho trtllm-serve")
    for version, want in (("1.2.1", plan.trtllm_serve[-1]), ("1.3.0rc5", plan.trtllm_serve[-1]),
                          ("1.4.0rc4", later), ("1.5.0", later)):
        site = tmp_path / version
        site.mkdir()
        (site / "tensorrt_llm.py").write_text(f"__version__ = {version!r}\n")
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "PYTHON": sys.executable, "PYTHONPATH": str(site)})
        assert r.returncode == 0 and r.stdout.strip().endswith(f"--config {want}"), (version, r.stdout, r.stderr)


def test_upstream_llmapi_config_pbtxt_is_upstreams(tmp_path):
    """deploy/llmapi/tensorrt_llm/config.pbtxt against the recorded upstream config.pbtxt (all_models/llmapi):
    Triton's ModelConfig proto parses it; name, backend, instance group, every input and output (name, dtype, dims,
    optional) and no parameters are upstream's; max_batch_size and the transaction policy are left out, as
    upstream leaves them to model.py's auto_complete_config (from model.yaml triton_config)."""
    from tritonclient.grpc import model_config_pb2

    from model_repo.generate import parse_config

    facts = json.loads((REPO_ROOT / "tests" / "facts" / "trtllm_1_2_1" / "triton_llmapi_model.json").read_text())
    up = facts["config_pbtxt"]
    plan = plan_deployment(_gpu_build(tmp_path, runtime="trtllm-llmapi"), get_target("h100"), tmp_path / "out")
    files = write_deployment(plan, tmp_path / "deploy")
    rel = sorted(str(f.relative_to(tmp_path / "deploy")) for f in files if "llmapi" in f.parts)
    # upstream's tree but for its Python code (facts: tree), which the README says to copy
    assert rel == sorted("llmapi/" + t for t in (p.split("/", 1)[1] for p in facts["tree"])
                         if not t.endswith(".py"))
    text = (tmp_path / "deploy" / "llmapi" / "tensorrt_llm" / "config.pbtxt").read_text()
    cfg = parse_config(text, "config.pbtxt")
    assert cfg.name == up["name"] == facts["tree_notes"]["model_name"] and cfg.backend == up["backend"] == "python"
    dtype = model_config_pb2.DataType.Name
    assert [{"name": i.name, "data_type": dtype(i.data_type), "dims": list(i.dims), "optional": i.optional}
            for i in cfg.input] == up["inputs"]
    outputs = [{"name": o.name, "data_type": dtype(o.data_type), "dims": list(o.dims)} for o in cfg.output]
    assert outputs == up["outputs"]
    assert dict(cfg.parameters) == up["parameters"] == {}
    assert [{"count": g.count, "kind": model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)}
            for g in cfg.instance_group] == up["instance_group"]
    assert not up["max_batch_size_in_file"] and not up["model_transaction_policy_in_file"]
    assert not [ln for ln in text.splitlines() if ln.startswith(("max_batch_size", "model_transaction_policy"))]
    assert not cfg.HasField("model_transaction_policy")
    assert cfg.max_batch_size == up["max_batch_size_effective"] == 0 and not cfg.HasField("dynamic_batching")
    readme = (tmp_path / "deploy" / "README.md").read_text()
    assert "{model.py,helpers.py}" in readme and "--disable-auto-complete-config" in readme


@pytest.mark.parametrize("runtime", ["pytorch", "trtllm", "trtllm-llmapi"])
def test_the_openai_frontend_runs_beside_triton_in_both_files(tmp_path, runtime):
    """compose: an `openai` service in triton's network namespace (its port published by triton), the project's
    image, read-only mount; Kubernetes: a sidecar container with a /health readiness probe and a Service port. Its
    command is one the frontend's own parser takes, pointing at Triton's gRPC port on 127.0.0.1."""
    from pipeline.openai_frontend import build_parser

    plan = plan_deployment(_gpu_build(tmp_path, runtime=runtime), get_target("h100"), tmp_path / "out")
    args = build_parser().parse_args(plan.openai[3:])
    assert plan.openai[:3] == ["python3", "-m", "pipeline.openai_frontend"]
    assert (args.grpc_url, args.port, args.host, args.triton_model) == (f"127.0.0.1:{plan.grpc_port}", 9000,
                                                                        "0.0.0.0", "tensorrt_llm_bls")
    assert str(args.tokenizer) == f"{plan.mount}/engine" and args.model == plan.name
    doc = compose(plan)
    svc = doc["services"]["openai"]
    assert svc["network_mode"] == "service:triton" and svc["image"] == plan.frontend_image
    assert f"127.0.0.1:9000:9000" in doc["services"]["triton"]["ports"] and svc["volumes"][0].endswith(":ro")
    assert "TRTPIPE_IMAGE" in plan.frontend_image  # the project's image: the frontend needs its packages
    dep, service = kubernetes(plan)
    pod = (dep["spec"]["template"] if dep["kind"] == "Deployment" else
           dep["spec"]["leaderWorkerTemplate"]["leaderTemplate"])["spec"]
    side = [c for c in pod["containers"] if c["name"] == "openai"]
    if runtime == "pytorch":  # Triton's image is the project's: the sidecar runs in the pod
        assert "profiles" not in svc
        assert side[0]["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9000}
        assert {"name": "openai", "port": 9000, "targetPort": 9000} in service["spec"]["ports"]
    else:  # the NGC image: the frontend needs TRTPIPE_IMAGE, so compose starts it only with --profile openai and
        # the pod goes without it (an unset image would keep the pod, and Triton, from starting)
        assert svc["profiles"] == ["openai"] and side == []
        assert all(p["name"] != "openai" for p in service["spec"]["ports"])


def test_the_frontend_is_told_when_the_engine_returns_context_logits(tmp_path):
    """limits.gather_context_logits reaches the frontend's command line (``--context-logits``) from the deployment
    files and from `trtpipe serve`'s launch, and its parser reads it back; without the field it is absent."""
    from pipeline.launch_config import frontend_launch
    from pipeline.openai_frontend import build_parser
    from pipeline.serve import ServerConfig

    spec = write_spec(tmp_path / "b.yaml", tmp_path, target="h100", runtime="trtllm",
                      extra="    limits: {gather_context_logits: true}\n")
    on, off = load_spec(spec, "h100"), _gpu_build(tmp_path / "off")
    assert on.settings.limits.gather_context_logits and not off.settings.limits.gather_context_logits
    for build, want in ((on, True), (off, False)):
        plan = plan_deployment(build, get_target("h100"), tmp_path / "out")
        assert build_parser().parse_args(plan.openai[3:]).context_logits is want
        assert ("--context-logits" in plan.openai) is want
        launch = frontend_launch(build, ServerConfig(model_repository=tmp_path / "repo"), 9000, tmp_path)
        assert build_parser().parse_args(launch.argv()[3:]).context_logits is want


def test_the_portable_runtime_pod_drains_its_requests_before_sigterm(tmp_path):
    """Its preStop hook asks the runtime to end requests in flight (trtpipe_runtime.lifeline) and waits for the
    acknowledgement; run here against a process that watches as the runtime does, /tmp swapped for a folder of its
    own. The C++ backend has no such watch: no hook."""
    import shlex
    import subprocess
    import sys

    from model_repo.deploy import PRE_STOP_DRAIN

    pod = kubernetes(plan_deployment(load_spec(DEFAULT, "cpu"), get_target("cpu"), tmp_path / "a"))[0]
    triton = pod["spec"]["template"]["spec"]["containers"][0]
    assert triton["lifecycle"]["preStop"]["exec"]["command"] == ["bash", "-c", PRE_STOP_DRAIN]
    engine = kubernetes(plan_deployment(_gpu_build(tmp_path / "b"), get_target("h100"), tmp_path / "b"))[0]
    assert "lifecycle" not in engine["spec"]["template"]["spec"]["containers"][0]

    watcher = ("import os, time; from trtpipe_runtime.lifeline import watch_drain\n"
               "watch_drain(lambda: os.write(1, b'drained\\n'), period_s=0.05)\n"
               "os.write(1, b'ready\\n'); time.sleep(600)\n")
    hook = f"bash -c {shlex.quote(PRE_STOP_DRAIN.replace('/tmp', str(tmp_path)))} && echo acknowledged"
    # the hook's shell is the watcher's parent, as tritonserver is the runtime's
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(watcher)} & sleep 1; {hook}; kill $!"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)})
    assert out.stdout.split() == ["ready", "drained", "acknowledged"], out.stderr
