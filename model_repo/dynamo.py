"""NVIDIA Dynamo deployment of a build: a DynamoGraphDeployment for Dynamo's operator, aggregated or disaggregated.

Dynamo (pinned :data:`DYNAMO_VERSION`) runs TensorRT-LLM workers behind its OpenAI-compatible frontend and KV-aware
router, on one node or across nodes (its operator places a worker that needs more GPUs than a node has over
``multinode.nodeCount`` nodes, through Grove or LeaderWorkerSet). Its TensorRT-LLM worker (``python3 -m
dynamo.trtllm``) runs TensorRT-LLM's PyTorch backend on an HF checkpoint: the ``trtllm-llmapi`` build's unified
checkpoint and its LLM-API options, one options file per role. The files (:func:`render`):

* ``dgd.yaml``: the DynamoGraphDeployment (``nvidia.com/v1beta1``, the version the 1.6.1 release's own TensorRT-LLM
  templates use): a ``Frontend`` component (``--router-mode``; ``kv`` routes on the workers' published KV events)
  and a worker component (aggregated) or prefill and decode components (``--disaggregation-mode``), each with the
  GPUs its role's tp x pp needs, the model volume, the engine options and readiness probes;
* ``engine-configs.yaml``: a ConfigMap with each role's LLM-API options (``builders.llmapi_options`` for the role's
  tp/pp, plus ``cache_transceiver_config`` for the KV transfer between prefill and decode workers);
* ``model-pvc.yaml`` and ``model-copy-pod.yaml``: the volume that holds the checkpoint and a pod to copy it in;
* ``README.md``: the commands.

Sources (ai-dynamo 1.6.1 wheel, recorded in ``tests/facts/dynamo_1_6_1/dgd.json``): the v1beta1 API
(``deploy/operator/api/v1beta1/*_types.go`` at ai-dynamo/dynamo 0fddc01b; ``dynamo/profiler/utils/config.py``: the
main container is named ``main``, GPUs are ``resources.limits["nvidia.com/gpu"]`` as a string, a worker needing
more GPUs than a node holds gets ``multinode.nodeCount = ceil(gpus / gpus_per_node)`` and ``min(gpus,
gpus_per_node)`` per pod), the TensorRT-LLM templates (``dynamo/profiler/templates/dgd/trtllm/{agg,disagg}.yaml``),
the worker's and frontend's flags (``dynamo/trtllm/backend_args.py``, ``dynamo/frontend/frontend_args.py``).
TensorRT-LLM's disaggregated-serving doc (``docs/source/features/disagg-serving.md``): context (prefill) workers run
without the overlap scheduler; both sides name the same ``cache_transceiver_config.backend``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import yaml

from builders import preflight
from builders.llmapi_options import llm_api_options, option_problems
from builders.plan import Plan
from builders.spec import ResolvedBuild
from model_repo.launch import dynamo_frontend_argv, dynamo_worker_argv
from plugins.errors import Problem, SpecError
from plugins.targets import TargetProfile

DYNAMO_VERSION = "1.6.1"
DYNAMO_TRTLLM_VERSION = "1.3.0rc29"
"""The TensorRT-LLM its TensorRT-LLM runtime image carries (ai-dynamo 1.6.1's ``trtllm`` extra pins it)."""
DYNAMO_IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_VERSION}"
API_VERSION = "nvidia.com/v1beta1"
OPTIONS_RELEASES = ["1.2.1", "1.4"]
"""The recorded TensorRT-LLM releases whose LLM-API fields the options must all pass (1.3.0rc29 lies between)."""
ROUTER_MODES = ("round-robin", "random", "power-of-two", "kv", "direct", "least-loaded", "device-aware-weighted")
"""``dynamo.frontend --router-mode`` choices (1.6.1)."""
KV_TRANSFER_BACKENDS = ("NIXL", "UCX", "MPI", "DEFAULT")
"""``cache_transceiver_config.backend`` values both recorded TensorRT-LLM releases accept (MOONCAKE is 1.4 only)."""
FRONTEND_PORT = 8000
"""``dynamo.frontend``'s own default ``--http-port`` (frontend_args.py, 1.6.1), passed explicitly: Dynamo's port, not
a trtpipe serving port (those default on builders.spec.ServingConfig only)."""
WORKER_SYSTEM_PORT = 9090
"""The worker's status server (``DYN_SYSTEM_PORT``; ``/health`` once its engine is loaded)."""
MODEL_MOUNT = "/models"
CONFIG_MOUNT = "/config"
ROLE_TYPES = {"agg": "worker", "prefill": "prefill", "decode": "decode"}
ROLE_NAMES = {"agg": "TRTLLMWorker", "prefill": "TRTLLMPrefillWorker", "decode": "TRTLLMDecodeWorker"}


@dataclass
class DynamoWorker:
    """One worker role and the sizes it runs with."""

    role: str
    """agg, prefill or decode."""
    tp_size: int
    pp_size: int
    replicas: int
    gpus_per_node: int
    options: dict = field(default_factory=dict)
    """Its LLM-API options (engine-configs.yaml)."""
    kv_pool: str = ""
    """The plan's KV pool for this role (one line)."""

    @property
    def name(self) -> str:
        return ROLE_NAMES[self.role]

    @property
    def gpus(self) -> int:
        """GPUs of one worker instance: tp x pp."""
        return self.tp_size * self.pp_size

    @property
    def nodes(self) -> int:
        """Nodes one instance spans (Dynamo's rule: ceil(gpus / gpus_per_node))."""
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def gpus_per_pod(self) -> int:
        return min(self.gpus, self.gpus_per_node)


@dataclass
class DynamoPlan:
    """What the Dynamo files hold."""

    name: str
    served_model_name: str
    disagg: bool
    router_mode: str
    kv_transfer_backend: Optional[str]
    workers: list[DynamoWorker]
    checkpoint_folder: str
    """Where the trtllm-llmapi build writes the checkpoint the volume must hold."""
    build_command: str
    volume_gib: int
    image: str = DYNAMO_IMAGE
    namespace: Optional[str] = None

    @property
    def model_path(self) -> str:
        return f"{MODEL_MOUNT}/{self.name}"

    def as_dict(self) -> dict:
        return asdict(self)


def _k8s_name(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return out[:50] or "trtpipe"


def role_build(build: ResolvedBuild, tp: int, pp: int, gpus_per_node: int) -> ResolvedBuild:
    """``build`` with one role's parallel sizes over as many nodes as they need (Dynamo's multinode placement)."""
    par = build.settings.parallelism.model_copy(update={
        "tp_size": tp, "pp_size": pp, "moe_tp_size": None, "moe_ep_size": None,
        "num_nodes": max(build.settings.parallelism.num_nodes, math.ceil(tp * pp / gpus_per_node))})
    return build.model_copy(update={"settings": build.settings.model_copy(update={"parallelism": par})})


def role_options(build: ResolvedBuild, plan: Plan, role: str, kv_transfer: Optional[str]) -> dict:
    """The LLM-API options of one role: the build's (builders.llmapi_options, 1.4 spelling) plus, when
    disaggregated, the KV transfer backend on both sides and no overlap scheduler on the prefill side."""
    options = llm_api_options(build, plan, "1.4")
    if role in ("prefill", "decode"):
        options["cache_transceiver_config"] = {"backend": kv_transfer,
                                               "max_tokens_in_buffer": build.settings.limits.max_seq_len}
        options["disable_overlap_scheduler"] = role == "prefill"
    return options


def plan_dynamo(build: ResolvedBuild, target: TargetProfile, hf_config: dict, *, disagg: bool,
                checkpoint_folder: str, build_command: str, router_mode: str = "kv",
                kv_transfer: Optional[str] = "NIXL", replicas: int = 1,
                prefill: tuple[Optional[int], Optional[int], int] = (None, None, 1),
                decode: tuple[Optional[int], Optional[int], int] = (None, None, 1),
                isl: int = 128, osl: int = 128) -> tuple[Optional[DynamoPlan], list[Problem]]:
    """The Dynamo deployment of ``build`` (a ``trtllm-llmapi`` build) on ``target``, or the problems that stop it.

    Args:
        prefill, decode: (tp_size, pp_size, replicas) of each role when ``disagg``; None sizes take the build's.
        replicas: worker replicas when aggregated.
        isl, osl: the workload the plan's KV lines describe.

    Returns:
        (plan, []) or (None, problems): every role is planned with the pre-flight rules and the memory plan
        (builders.preflight.make_plan) at its own tp/pp, its options checked against TensorRT-LLM's recorded
        LLM-API fields, and the graph against :func:`graph_problems`.
    """
    problems: list[Problem] = []
    if build.runtime.name != "trtllm-llmapi":
        problems.append(Problem("runtime", build.runtime.name, "Dynamo's TensorRT-LLM worker runs TensorRT-LLM's "
                                "PyTorch backend on an HF checkpoint (runtime trtllm-llmapi)",
                                "deploy with --runtime trtllm-llmapi", code="dynamo_runtime"))
        return None, problems
    if router_mode not in ROUTER_MODES:
        problems.append(Problem("--router-mode", router_mode, f"dynamo.frontend {DYNAMO_VERSION} takes "
                                f"{' | '.join(ROUTER_MODES)}", "use kv (KV-aware) or round-robin",
                                code="dynamo_router_mode"))
    if disagg and kv_transfer not in KV_TRANSFER_BACKENDS:
        problems.append(Problem("--kv-transfer", kv_transfer, "disaggregated serving moves each request's KV cache "
                                "from the prefill to the decode worker: it needs a cache_transceiver_config backend "
                                f"({' | '.join(KV_TRANSFER_BACKENDS)})", "pass --kv-transfer NIXL",
                                code="dynamo_kv_transfer"))
    gpn = build.settings.parallelism.gpus_per_node or target.gpus_per_node
    par = build.settings.parallelism
    roles = ([("prefill",) + prefill, ("decode",) + decode] if disagg else [("agg", None, None, replicas)])
    workers = []
    for role, tp, pp, reps in roles:
        tp, pp = tp or par.tp_size, pp or par.pp_size
        where = f"--{role}-tp/--{role}-pp" if role != "agg" else "parallelism.tp_size/pp_size"
        if reps < 1:
            problems.append(Problem(f"--{role}-replicas" if role != "agg" else "--replicas", reps, "must be >= 1",
                                    "set 1 or more", code="dynamo_replicas"))
        rb = role_build(build, tp, pp, gpn)
        try:
            plan = preflight.make_plan(rb, target, hf_config, isl=isl, osl=osl)
        except SpecError as e:  # the rule, per role
            problems += [Problem(f"{role} worker: {p.field}", p.value, p.rule, p.fix, p.code) for p in e.problems]
            continue
        w = DynamoWorker(role=role, tp_size=tp, pp_size=pp, replicas=reps, gpus_per_node=gpn,
                         options=role_options(rb, plan, role, kv_transfer),
                         kv_pool=f"{plan.memory.kv.capacity_tokens:,} KV tokens per rank, "
                                 f"{plan.memory.kv.workload_concurrency} sequences of {isl}+{osl} in flight")
        problems += [Problem(f"{role} worker: {p.field}", p.value, p.rule, p.fix, p.code)
                     for p in option_problems(w.options, "engine options", releases=OPTIONS_RELEASES)]
        if w.gpus > gpn and w.gpus % gpn:
            problems.append(Problem(where, f"{tp}x{pp}", f"a {role} worker needs {w.gpus} GPUs, more than a node's "
                                    f"{gpn} and not a multiple of it: Dynamo spreads one instance over whole nodes "
                                    "(multinode.nodeCount x GPUs per pod)",
                                    f"use tp x pp <= {gpn} or a multiple of {gpn}", code="dynamo_node_gpus"))
        workers.append(w)
    if problems:
        return None, problems
    # the volume: the checkpoint (every parameter at the recipe's bits, 16-bit where unquantized) with headroom
    params = preflight.make_plan(build, target, hf_config).memory.params_total
    volume = max(10, math.ceil(params * build.recipe.weight_bits / 8 * 1.5 / 2**30))
    name = _k8s_name(build.name)
    return DynamoPlan(name=name, served_model_name=build.name, disagg=disagg, router_mode=router_mode,
                      kv_transfer_backend=kv_transfer if disagg else None, workers=workers,
                      checkpoint_folder=checkpoint_folder, build_command=build_command, volume_gib=volume), []


def _probe(path: str, port: int, *, initial_s: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "initialDelaySeconds": initial_s, "periodSeconds": 10,
            "timeoutSeconds": 5, "failureThreshold": failures}


def _frontend(plan: DynamoPlan) -> dict:
    argv = dynamo_frontend_argv(FRONTEND_PORT, plan.router_mode)
    main = {"name": "main", "image": plan.image, "command": argv[:1], "args": argv[1:],
            "ports": [{"name": "http", "containerPort": FRONTEND_PORT}],
            "readinessProbe": _probe("/health", FRONTEND_PORT, initial_s=10, failures=6),
            "livenessProbe": _probe("/live", FRONTEND_PORT, initial_s=30, failures=6)}
    return {"name": "Frontend", "type": "frontend", "replicas": 1, "podTemplate": {"spec": {"containers": [main]}}}


def worker_argv(plan: DynamoPlan, w: DynamoWorker) -> list[str]:
    """The ``dynamo.trtllm`` command of one worker (model, served name, its options file, its role; KV events for
    the KV router)."""
    return dynamo_worker_argv(model_path=plan.model_path, served_model_name=plan.served_model_name,
                              options_file=f"{CONFIG_MOUNT}/{w.role}.yaml", role=w.role,
                              publish_kv_events=plan.router_mode == "kv")


def _worker(plan: DynamoPlan, w: DynamoWorker) -> dict:
    gpus = str(w.gpus_per_pod)
    main = {"name": "main", "image": plan.image, "workingDir": "/workspace",
            "command": worker_argv(plan, w)[:3], "args": worker_argv(plan, w)[3:],
            # the status server, healthy once the generate endpoint serves (what the readiness probe asks)
            "env": [{"name": "DYN_SYSTEM_ENABLED", "value": "true"},
                    {"name": "DYN_SYSTEM_PORT", "value": str(WORKER_SYSTEM_PORT)},
                    {"name": "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", "value": '["generate"]'}],
            "ports": [{"name": "system", "containerPort": WORKER_SYSTEM_PORT}],
            "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
            "volumeMounts": [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
                             {"name": "engine-configs", "mountPath": CONFIG_MOUNT, "readOnly": True}],
            # loading and warming an engine takes minutes: ready only then, not restarted meanwhile
            "readinessProbe": _probe("/health", WORKER_SYSTEM_PORT, initial_s=60, failures=60),
            "livenessProbe": _probe("/live", WORKER_SYSTEM_PORT, initial_s=600, failures=6)}
    spec = {"containers": [main],
            "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": f"{plan.name}-model"}},
                        {"name": "engine-configs", "configMap": {"name": f"{plan.name}-engine-configs"}}]}
    comp = {"name": w.name, "type": ROLE_TYPES[w.role], "replicas": w.replicas, "podTemplate": {"spec": spec}}
    if w.nodes > 1:
        comp["multinode"] = {"nodeCount": w.nodes}
    return comp


def dgd(plan: DynamoPlan) -> dict:
    """The DynamoGraphDeployment document."""
    meta = {"name": f"{plan.name}-{'disagg' if plan.disagg else 'agg'}",
            "labels": {"app.kubernetes.io/managed-by": "trtpipe"}}
    if plan.namespace:
        meta["namespace"] = plan.namespace
    return {"apiVersion": API_VERSION, "kind": "DynamoGraphDeployment", "metadata": meta,
            "spec": {"backendFramework": "trtllm",
                     "components": [_frontend(plan)] + [_worker(plan, w) for w in plan.workers]}}


def engine_configmap(plan: DynamoPlan) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{plan.name}-engine-configs"},
            "data": {f"{w.role}.yaml": yaml.safe_dump(w.options, sort_keys=False) for w in plan.workers}}


def model_pvc(plan: DynamoPlan) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{plan.name}-model"},
            "spec": {"accessModes": ["ReadWriteMany"],  # every worker pod mounts it, on several nodes
                     "resources": {"requests": {"storage": f"{plan.volume_gib}Gi"}}}}


def copy_pod(plan: DynamoPlan) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{plan.name}-model-copy"},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "copy", "image": "busybox:1.37", "command": ["sleep", "86400"],
                                     "volumeMounts": [{"name": "model", "mountPath": MODEL_MOUNT}]}],
                     "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": f"{plan.name}-model"}}]}}


def graph_problems(docs: dict[str, dict], gpus_per_node: int) -> list[Problem]:
    """Rules on the rendered files (what the operator would be given), each naming the component.

    A worker's GPUs (``nvidia.com/gpu`` per pod x ``multinode.nodeCount``) equal tp x pp of its role's options; no
    pod asks for more than a node's GPUs; prefill and decode workers name the same KV transfer backend; the
    frontend sets its router mode; each worker's options file is in the ConfigMap.
    """
    problems = []
    configs = {k: yaml.safe_load(v) for k, v in docs["engine-configs.yaml"]["data"].items()}
    comps = docs["dgd.yaml"]["spec"]["components"]
    backends = set()
    for c in comps:
        main = next(x for x in c["podTemplate"]["spec"]["containers"] if x["name"] == "main")
        args = main.get("args") or []
        if c["type"] == "frontend":
            if "--router-mode" not in args or args[args.index("--router-mode") + 1] not in ROUTER_MODES:
                problems.append(Problem(f"{c['name']}.args", args, "the frontend's --router-mode is not set to a "
                                        "known mode", "set --router-mode kv", code="dynamo_router_mode"))
            continue
        opts_file = args[args.index("--extra-engine-args") + 1].rsplit("/", 1)[-1] \
            if "--extra-engine-args" in args else None
        opts = configs.get(opts_file)
        if opts is None:
            problems.append(Problem(f"{c['name']}.args", opts_file, "its --extra-engine-args file is not in the "
                                    "engine-configs ConfigMap", "regenerate the files", code="dynamo_options"))
            continue
        per_pod = int((main.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
        nodes = int((c.get("multinode") or {}).get("nodeCount", 1))
        want = opts["tensor_parallel_size"] * opts["pipeline_parallel_size"]
        if per_pod * nodes != want:
            problems.append(Problem(f"{c['name']}.resources", f"{per_pod} GPU(s) x {nodes} node(s)",
                                    f"its role runs tp x pp = {want} GPUs", "regenerate the files",
                                    code="dynamo_gpu_count"))
        if per_pod > gpus_per_node:
            problems.append(Problem(f"{c['name']}.resources", per_pod, f"more GPUs than a node's {gpus_per_node}",
                                    "spread the worker over nodes (multinode.nodeCount)", code="dynamo_node_gpus"))
        if c["type"] in ("prefill", "decode"):
            backends.add((opts.get("cache_transceiver_config") or {}).get("backend"))
    if any(c["type"] in ("prefill", "decode") for c in comps):
        if None in backends or len(backends) != 1:
            problems.append(Problem("engine-configs.yaml: cache_transceiver_config.backend", sorted(map(str, backends)),
                                    "prefill and decode workers must name one KV transfer backend",
                                    "set --kv-transfer", code="dynamo_kv_transfer"))
    return problems


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the options files inside the ConfigMap) as literal blocks, readable as written."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                              style="|" if "\n" in s else None))


def render(plan: DynamoPlan) -> dict[str, str]:
    """The files' text by name (the YAML documents and README.md)."""
    docs = {"dgd.yaml": dgd(plan), "engine-configs.yaml": engine_configmap(plan), "model-pvc.yaml": model_pvc(plan),
            "model-copy-pod.yaml": copy_pod(plan)}
    head = (f"# Written by trtpipe for NVIDIA Dynamo {DYNAMO_VERSION} ({DYNAMO_IMAGE}, TensorRT-LLM "
            f"{DYNAMO_TRTLLM_VERSION}); see README.md in this folder.\n")
    out = {k: head + yaml.dump(v, Dumper=_Dumper, sort_keys=False) for k, v in docs.items()}
    out["README.md"] = readme(plan)
    return out


def documents(files: dict[str, str]) -> dict[str, dict]:
    """The YAML documents of :func:`render`'s files, by file name."""
    return {k: yaml.safe_load(v) for k, v in files.items() if k.endswith(".yaml")}


def readme(plan: DynamoPlan) -> str:
    mode = "disaggregated (prefill and decode workers)" if plan.disagg else "aggregated"
    dgd_name = f"{plan.name}-{'disagg' if plan.disagg else 'agg'}"
    rows = "\n".join(f"| {w.name} | {w.role} | {w.tp_size} x {w.pp_size} | {w.gpus} ({w.gpus_per_pod} per pod x "
                     f"{w.nodes} node(s)) | {w.replicas} | {w.kv_pool} |" for w in plan.workers)
    total = sum(w.gpus * w.replicas for w in plan.workers)
    kv = (f"KV transfer between them: `cache_transceiver_config.backend: {plan.kv_transfer_backend}` in both "
          "options files (prefill workers run without the overlap scheduler).\n" if plan.disagg else "")
    return f"""# {plan.served_model_name} on NVIDIA Dynamo {DYNAMO_VERSION}: {mode}

Generated by `trtpipe deploy --engine dynamo`{' --disagg' if plan.disagg else ''}. Image `{plan.image}` (TensorRT-LLM
{DYNAMO_TRTLLM_VERSION}, PyTorch backend). Frontend: Dynamo's OpenAI-compatible server on port {FRONTEND_PORT}, router
mode `{plan.router_mode}`{' (KV-aware: workers publish their KV events)' if plan.router_mode == 'kv' else ''}.

| component | role | tp x pp | GPUs per instance | replicas | KV (this build's plan) |
|---|---|---|---|---|---|
{rows}

{total} GPUs in all. {kv}
## 1. Install Dynamo's operator (once per cluster)

```bash
helm fetch https://helm.ngc.nvidia.com/nvidia/ai-dynamo/charts/dynamo-crds-{DYNAMO_VERSION}.tgz
helm fetch https://helm.ngc.nvidia.com/nvidia/ai-dynamo/charts/dynamo-platform-{DYNAMO_VERSION}.tgz
helm install dynamo-crds dynamo-crds-{DYNAMO_VERSION}.tgz --namespace default
helm install dynamo-platform dynamo-platform-{DYNAMO_VERSION}.tgz --namespace dynamo-system --create-namespace
```

A worker that needs more GPUs than a node has runs over `multinode.nodeCount` nodes: the operator needs Grove (with
the KAI scheduler) or LeaderWorkerSet (with Volcano) installed for that.

## 2. Put the checkpoint on the volume

The workers load the `trtllm-llmapi` build's unified HF checkpoint (`{plan.checkpoint_folder}`; build it with
`{plan.build_command}`).

```bash
kubectl apply -f model-pvc.yaml -f model-copy-pod.yaml
kubectl wait --for=condition=Ready pod/{plan.name}-model-copy
kubectl exec {plan.name}-model-copy -- mkdir -p {plan.model_path}
kubectl cp {plan.checkpoint_folder}/. {plan.name}-model-copy:{plan.model_path}
kubectl delete pod {plan.name}-model-copy
```

## 3. Deploy and query

```bash
kubectl apply -f engine-configs.yaml -f dgd.yaml
kubectl get dynamographdeployment {dgd_name} -w      # until the state is successful
kubectl port-forward svc/{dgd_name}-frontend {FRONTEND_PORT}:{FRONTEND_PORT}
curl localhost:{FRONTEND_PORT}/v1/models
python -c "from openai import OpenAI; c = OpenAI(base_url='http://localhost:{FRONTEND_PORT}/v1', api_key='-'); \\
print(c.chat.completions.create(model='{plan.served_model_name}', messages=[{{'role': 'user', 'content': 'Hi'}}]).choices[0].message.content)"
trtpipe loadtest run --url http://localhost:{FRONTEND_PORT}/v1 --endpoint openai-chat --model {plan.served_model_name} \\
  --tokenizer {plan.checkpoint_folder} --concurrency 1,8,32
```

(The frontend's Service is created by the operator as `<graph>-frontend`; `kubectl get svc` shows it.)

Access: Dynamo {DYNAMO_VERSION}'s frontend takes no API key (`dynamo.frontend` has no such option:
tests/facts/tritonserver_2_51/restricted_api.json `others`), so anyone who reaches its port can use the model.
Keep its Service inside the cluster (ClusterIP, as the operator makes it; reach it with `kubectl port-forward`)
or put an authenticating gateway in front of it; do not turn it into a LoadBalancer or NodePort.

## Files

- `dgd.yaml`: the DynamoGraphDeployment (`{API_VERSION}`).
- `engine-configs.yaml`: each role's TensorRT-LLM LLM-API options, mounted at `{CONFIG_MOUNT}/<role>.yaml`.
- `model-pvc.yaml`, `model-copy-pod.yaml`: the {plan.volume_gib} GiB volume (ReadWriteMany: every worker pod
  mounts it) and a pod to copy the checkpoint in.
"""
