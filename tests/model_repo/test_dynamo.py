"""Dynamo deployment files (model_repo/dynamo.py), checked without a cluster.

- against the DynamoGraphDeployment fields recorded from Dynamo 1.6.1 (tests/facts/dynamo_1_6_1/dgd.json, made into a
  JSON schema here), and those facts against the installed ai-dynamo 1.6.1 wheel (.dynamo/, make setup): its own
  TensorRT-LLM templates, its frontend's router modes, its worker's flags;
- the Kubernetes objects (ConfigMap, PersistentVolumeClaim, Pod) and every component's pod template against the
  Kubernetes schemas (kubernetes-validate);
- our rules (model_repo.dynamo.graph_problems, plan_dynamo): each broken on purpose.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from model_repo import dynamo
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import REPO, hf_config

FACTS = json.loads((REPO / "tests" / "facts" / "dynamo_1_6_1" / "dgd.json").read_text())
LLAMA = REPO / "configs" / "builds" / "llama-3-8b.yaml"
WHEEL = REPO / ".dynamo" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "dynamo"
K8S_VERSION = "1.30"


def _need(ok: bool, why: str) -> None:
    """Fail (never skip) when a tool or schema is missing: `make setup` (scripts/setup.sh) installs every one."""
    if not ok:
        pytest.fail(f"{why} (`make setup` / `scripts/setup.sh --tools` installs it: run it)")


def facts_schema() -> dict:
    """A JSON schema of the recorded DGD fields (types, enums, name pattern, nodeCount minimum); unknown fields fail."""
    def prop(f: dict) -> dict:
        out = {"type": f["type"]}
        for k, j in (("enum", "enum"), ("minimum", "minimum"), ("pattern", "pattern"), ("max_length", "maxLength"),
                     ("max_items", "maxItems")):
            if k in f:
                out[j] = f[k]
        if "fields" in f:
            out.update(properties={k: prop(v) for k, v in f["fields"].items()}, additionalProperties=False)
        return out
    comp = {k: prop(v) for k, v in FACTS["component"].items()}
    component = {"type": "object", "properties": comp, "additionalProperties": False,
                 "required": [k for k, v in FACTS["component"].items() if v.get("required")]}
    spec = {k: prop(v) for k, v in FACTS["spec"].items()}
    spec["components"]["items"] = component
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": FACTS["api_version"]}, "kind": {"const": FACTS["kind"]},
                           "metadata": {"type": "object", "required": ["name"]},
                           "spec": {"type": "object", "properties": spec, "additionalProperties": False}}}


def generate(*args: str, tmp_path) -> dict[str, dict]:
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "deploy", str(LLAMA), "--target", "h200", "--engine",
                        "dynamo", *args, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    folder = out / "llama-3-8b" / "h200" / "dynamo" / ("disagg" if "--disagg" in args else "agg")
    files = {p.name: p.read_text() for p in folder.iterdir()}
    assert set(files) == {"dgd.yaml", "engine-configs.yaml", "model-pvc.yaml", "model-copy-pod.yaml", "README.md"}
    return dynamo.documents(files)


@pytest.fixture(scope="module")
def disagg(tmp_path_factory):
    return generate("--disagg", tmp_path=tmp_path_factory.mktemp("disagg"))


def _components(docs) -> dict[str, dict]:
    return {c["name"]: c for c in docs["dgd.yaml"]["spec"]["components"]}


def _main(component: dict) -> dict:
    return next(c for c in component["podTemplate"]["spec"]["containers"] if c["name"] == "main")


def test_disagg_files_pass_the_recorded_dynamo_fields_and_our_rules(disagg):
    jsonschema.validate(disagg["dgd.yaml"], facts_schema())
    comps = _components(disagg)
    assert {c["type"] for c in comps.values()} == {"frontend", "prefill", "decode"}
    configs = {k: yaml.safe_load(v) for k, v in disagg["engine-configs.yaml"]["data"].items()}
    for name, role in (("TRTLLMPrefillWorker", "prefill"), ("TRTLLMDecodeWorker", "decode")):
        main, opts = _main(comps[name]), configs[f"{role}.yaml"]
        args = main["args"]
        assert args[args.index("--disaggregation-mode") + 1] == role
        assert main["resources"]["limits"][FACTS["gpu_resource_key"]] == str(
            opts["tensor_parallel_size"] * opts["pipeline_parallel_size"])
        assert opts["cache_transceiver_config"]["backend"] == "NIXL"
    assert configs["prefill.yaml"]["disable_overlap_scheduler"] is True
    assert configs["decode.yaml"]["disable_overlap_scheduler"] is False
    fe = _main(comps["Frontend"])["args"]
    assert fe[fe.index("--router-mode") + 1] == "kv"
    assert dynamo.graph_problems(disagg, get_target("h200").gpus_per_node) == []


def test_a_broken_dgd_fails_the_recorded_fields(disagg):
    schema = facts_schema()
    for break_it in (lambda d: d["spec"]["components"][1].update(componentType="worker"),  # v1alpha1 spelling
                     lambda d: d["spec"]["components"][1].update(type="prefil"),
                     lambda d: d["spec"]["components"][1].update(name="TRTLLM_Worker"),
                     lambda d: d["spec"].update(services={}),
                     lambda d: d["spec"]["components"][2].update(multinode={"nodeCount": 1}),
                     lambda d: d.update(apiVersion="nvidia.com/v1alpha1")):
        bad = copy.deepcopy(disagg["dgd.yaml"])
        break_it(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_kubernetes_objects_and_pod_templates_pass_kubernetes_schemas(disagg):
    try:
        import kubernetes_validate as kv
    except ImportError:
        kv = None
    _need(kv is not None, "kubernetes-validate is not installed (pip install -e '.[test]')")
    for name in ("engine-configs.yaml", "model-pvc.yaml", "model-copy-pod.yaml"):
        kv.validate(disagg[name], K8S_VERSION, strict=True)
    for c in disagg["dgd.yaml"]["spec"]["components"]:  # podTemplate is a core PodTemplateSpec
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": c["name"].lower()},
                     "template": c["podTemplate"]}, K8S_VERSION, strict=True)
    bad = copy.deepcopy(disagg["dgd.yaml"]["spec"]["components"][1]["podTemplate"])
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = {"count": 1}
    with pytest.raises(kv.ValidationError):
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": bad},
                    K8S_VERSION, strict=True)


def test_the_files_match_dynamo_1_6_1s_own_trtllm_templates(disagg):
    """The release's own TensorRT-LLM DGDs (inside the ai-dynamo 1.6.1 wheel): same apiVersion, component types,
    main container, GPU key and value type, worker command; our worker flags are flags its templates use."""
    _need((WHEEL / "profiler" / "templates" / "dgd" / "trtllm" / "disagg.yaml").is_file(),
          "ai-dynamo 1.6.1 is not installed in .dynamo/ (make setup)")
    theirs = yaml.safe_load((WHEEL / "profiler" / "templates" / "dgd" / "trtllm" / "disagg.yaml").read_text())
    ours = disagg["dgd.yaml"]
    assert ours["apiVersion"] == theirs["apiVersion"] == FACTS["api_version"]
    by_type = {c["type"]: c for c in theirs["spec"]["components"]}
    assert set(by_type) == {c["type"] for c in ours["spec"]["components"]}
    their_flags = {a for c in theirs["spec"]["components"] for a in _main(c).get("args", []) if a.startswith("--")}
    for c in ours["spec"]["components"]:
        mine, ref = _main(c), _main(by_type[c["type"]])
        if c["type"] == "frontend":
            assert mine["command"] == ref["command"] and mine["args"][:2] == ref["args"][:2]
            continue
        assert mine["command"] == ref["command"] == FACTS["trtllm_worker"]["command"]
        assert {a for a in mine["args"] if a.startswith("--")} <= their_flags
        assert set(mine["resources"]["limits"]) == set(ref["resources"]["limits"]) == {FACTS["gpu_resource_key"]}
        assert isinstance(mine["resources"]["limits"][FACTS["gpu_resource_key"]], str)
    assert FACTS["image"] in {_main(c)["image"] for c in theirs["spec"]["components"]} and \
        _main(ours["spec"]["components"][0])["image"] == FACTS["image"]


def test_recorded_frontend_and_worker_flags_are_the_installed_releases():
    py = REPO / ".dynamo" / "bin" / "python"
    _need(py.is_file(), "ai-dynamo 1.6.1 is not installed in .dynamo/ (make setup)")
    r = subprocess.run([str(py), "-m", "dynamo.frontend", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    line = next(ln for ln in r.stdout.splitlines() if "[--router-mode {" in ln)
    assert line.split("{")[1].split("}")[0].split(",") == FACTS["frontend"]["router_modes"] == list(dynamo.ROUTER_MODES)
    src = (WHEEL / "trtllm" / "backend_args.py").read_text() + (WHEEL / "trtllm" / "args.py").read_text()
    for flag in FACTS["trtllm_worker"]["flags"]:
        if flag != "--model-path":  # an alias declared with --model
            assert f'"{flag}"' in src, flag
    assert "--model-path" in (WHEEL / "trtllm" / "backend_args.py").read_text()


def test_aiconfigurators_generator_stops_before_dynamo_1_6():
    """Why ours are generated here and not by aiconfigurator: its 0.12.0 generator's version matrix ends at
    Dynamo 1.3.0 (and emits v1alpha1); 1.6.1 is not in it."""
    matrix = REPO / ".aiconfigurator" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "aiconfigurator" / "generator" / "config" / "backend_version_matrix.yaml"
    _need(matrix.is_file(), "aiconfigurator is not installed in .aiconfigurator/ (make setup)")
    versions = list(yaml.safe_load(matrix.read_text())["matrix"])
    newest = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")[:3]))
    assert newest == FACTS["aiconfigurator_generator"]["max_dynamo_version"]
    assert dynamo.DYNAMO_VERSION not in versions


def test_aggregated_files(tmp_path):
    docs = generate("--replicas", "2", tmp_path=tmp_path)
    jsonschema.validate(docs["dgd.yaml"], facts_schema())
    comps = _components(docs)
    assert set(comps) == {"Frontend", "TRTLLMWorker"} and comps["TRTLLMWorker"]["type"] == "worker"
    assert comps["TRTLLMWorker"]["replicas"] == 2
    args = _main(comps["TRTLLMWorker"])["args"]
    assert args[args.index("--disaggregation-mode") + 1] == "agg"
    assert "cache_transceiver_config" not in yaml.safe_load(docs["engine-configs.yaml"]["data"]["agg.yaml"])


def _plan(overrides=None, **kw):
    build = load_spec(LLAMA, "h200", {"runtime": "trtllm-llmapi", **(overrides or {})})
    return dynamo.plan_dynamo(build, get_target("h200"), hf_config("llama-3-8b"), checkpoint_folder="/ckpt",
                              build_command="trtpipe build ...", **kw)


def test_a_worker_wider_than_a_node_spans_whole_nodes():
    plan, problems = _plan(disagg=True, decode=(16, 1, 1))
    assert problems == []
    docs = dynamo.documents(dynamo.render(plan))
    dec = _components(docs)["TRTLLMDecodeWorker"]
    assert dec["multinode"] == {"nodeCount": 2} and _main(dec)["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert dynamo.graph_problems(docs, 8) == []
    jsonschema.validate(docs["dgd.yaml"], facts_schema())


@pytest.mark.parametrize("kw, code, where", [
    ({"disagg": True, "kv_transfer": None}, "dynamo_kv_transfer", "--kv-transfer"),
    ({"disagg": False, "router_mode": "fastest"}, "dynamo_router_mode", "--router-mode"),
    ({"disagg": True, "decode": (8, 1, 1), "overrides": {"parallelism": {"gpus_per_node": 6}}}, "dynamo_node_gpus",
     "--decode-tp"),  # 8 GPUs on 6-GPU nodes: not whole nodes
    ({"disagg": True, "prefill": (3, 1, 1)}, None, "prefill worker: parallelism.tp_size"),  # 32 heads / 3
    ({"disagg": True, "decode": (1, 1, 0)}, "dynamo_replicas", "--decode-replicas"),
])
def test_plan_refusals_name_the_role_and_the_fix(kw, code, where):
    plan, problems = _plan(**kw)
    assert plan is None and problems
    assert any(p.field.startswith(where) and (code is None or p.code == code) for p in problems), problems


def test_the_portable_runtime_cannot_go_on_dynamo():
    build = load_spec(LLAMA, "h200", {"runtime": "pytorch"})
    plan, problems = dynamo.plan_dynamo(build, get_target("h200"), hf_config("llama-3-8b"), disagg=False,
                                        checkpoint_folder="/c", build_command="")
    assert plan is None and problems[0].code == "dynamo_runtime" and "trtllm-llmapi" in problems[0].fix


@pytest.mark.parametrize("break_it, code", [
    (lambda d: _main(_components(d)["TRTLLMDecodeWorker"])["resources"]["limits"].update({"nvidia.com/gpu": "2"}),
     "dynamo_gpu_count"),
    (lambda d: _components(d)["TRTLLMDecodeWorker"].update(multinode={"nodeCount": 2}), "dynamo_gpu_count"),
    (lambda d: d["engine-configs.yaml"]["data"].update(
        {"decode.yaml": d["engine-configs.yaml"]["data"]["decode.yaml"].replace("backend: NIXL", "backend: UCX")}),
     "dynamo_kv_transfer"),
    (lambda d: _main(_components(d)["Frontend"]).update(args=["-m", "dynamo.frontend"]), "dynamo_router_mode"),
    (lambda d: d["engine-configs.yaml"]["data"].pop("prefill.yaml"), "dynamo_options"),
])
def test_graph_rules_catch_a_broken_graph(disagg, break_it, code):
    docs = copy.deepcopy(disagg)
    break_it(docs)
    assert code in {p.code for p in dynamo.graph_problems(docs, 8)}


def test_a_pod_may_not_ask_for_more_gpus_than_a_node_has(disagg):
    docs = copy.deepcopy(disagg)
    assert "dynamo_node_gpus" in {p.code for p in dynamo.graph_problems(docs, 0)}
