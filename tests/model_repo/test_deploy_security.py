"""Keys in the deployment files: Triton's admin APIs restricted and the OpenAI frontend's key wired from the
environment (compose) or a Secret (Kubernetes), in every generated command; no key value in any generated file.
The commands are run through the real bash (as the containers run them) to see what tritonserver is given."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from builders.spec import load_spec
from model_repo.deploy import (SECRET_KEYS, compose, kubernetes, plan_deployment, render_deployment, secret_command,
                               secret_name)
from model_repo.launch import (FRONTEND_API_KEY_ENV, TRITON_ADMIN_APIS, TRITON_ADMIN_KEY_ENV, leader_mode_argv,
                               triton_restricted_argv)
from plugins.targets import get_target
from tests.conftest import REPO, write_spec

DEFAULT = REPO / "configs" / "builds" / "smollm2-135m.yaml"
SENTINEL = "s3cr3t-v4lue-that-must-not-leak"
FACTS = REPO / "tests" / "facts" / "tritonserver_2_51" / "restricted_api.json"


def _gpu_build(tmp_path, tp=1, pp=1, runtime="trtllm"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    extra = f"    parallelism: {{tp_size: {tp}, pp_size: {pp}}}\n"
    return load_spec(write_spec(tmp_path / "b.yaml", tmp_path, target="h100", runtime=runtime, extra=extra), "h100")


def expanded(command: str, env: dict) -> subprocess.CompletedProcess:
    """The arguments the container's bash gives the program of ``command`` (one ``bash -lc`` line): bash expands the
    line as it would run it and prints each argument NUL-terminated instead of running it."""
    return subprocess.run(["bash", "-c", f"set -- {command}\nprintf '%s\\0' \"$@\""], env=env, capture_output=True,
                          text=True, timeout=30)


def compose_command(service: dict) -> str:
    """The line compose hands to ``bash -lc``: compose turns each ``$$`` of the file into ``$`` and fills in any other
    ``$`` itself, from the host, when it reads the file; so none may be left (the key would be the host's, or empty,
    and written into the container's definition)."""
    assert service["command"][:2] == ["bash", "-lc"]
    pieces = service["command"][2].split("$$")
    assert not any("$" in p for p in pieces), "a $ that compose would fill in from the host"
    return "$".join(pieces)


def test_restricted_options_follow_the_recorded_syntax():
    facts = json.loads(FACTS.read_text())
    assert set(TRITON_ADMIN_APIS) <= set(facts["api_groups"])
    http, grpc = triton_restricted_argv("abc")
    assert http == "--http-restricted-api=" + ",".join(TRITON_ADMIN_APIS) + ":admin-key=abc"
    assert grpc == "--grpc-restricted-protocol=" + ",".join(TRITON_ADMIN_APIS) + ":admin-key=abc"
    for bad in ("", "a:b", "a=b", "a,b"):
        with pytest.raises(ValueError):
            triton_restricted_argv(bad)


def test_compose_restricts_triton_with_the_hosts_key_and_refuses_to_start_without(tmp_path):
    plan = plan_deployment(load_spec(DEFAULT, "cpu"), get_target("cpu"), tmp_path / "out")
    doc = compose(plan)
    triton = doc["services"]["triton"]
    assert triton["environment"] == {TRITON_ADMIN_KEY_ENV: None}  # passed through from the host, no value
    line = compose_command(triton)
    ok = expanded(line, {"PATH": "/usr/bin:/bin", TRITON_ADMIN_KEY_ENV: SENTINEL})
    args = ok.stdout.split("\0")[:-1]
    assert ok.returncode == 0 and args[0] == "tritonserver"
    assert [a for a in args if "restricted" in a] == triton_restricted_argv(SENTINEL)
    refused = expanded(line, {"PATH": "/usr/bin:/bin"})
    assert refused.returncode != 0 and refused.stdout == ""
    assert f"set {TRITON_ADMIN_KEY_ENV}" in refused.stderr and "docs/deploy.md" in refused.stderr
    assert doc["services"]["openai"]["environment"] == {FRONTEND_API_KEY_ENV: None}
    assert "--api-key" not in doc["services"]["openai"]["command"][2]  # never on a command line


@pytest.mark.parametrize("tp,pp", [(1, 1), (8, 2)])
def test_kubernetes_reads_both_keys_from_the_secret(tmp_path, tp, pp):
    plan = plan_deployment(_gpu_build(tmp_path, tp=tp, pp=pp, runtime="trtllm"), get_target("h100"),
                           tmp_path / "out")
    plan = plan.__class__(**{**plan.as_dict(), "frontend_image": plan.image})  # the sidecar in the pod too
    workload = kubernetes(plan)[0]
    pods = ([workload["spec"]["template"]] if workload["kind"] == "Deployment" else
            [workload["spec"]["leaderWorkerTemplate"][t] for t in ("leaderTemplate", "workerTemplate")])
    want = {c: {"name": env, "valueFrom": {"secretKeyRef": {"name": secret_name(plan.name), "key": SECRET_KEYS[env]}}}
            for c, env in (("triton", TRITON_ADMIN_KEY_ENV), ("openai", FRONTEND_API_KEY_ENV))}
    seen = set()
    for pod in pods:
        for c in pod["spec"]["containers"]:
            assert want[c["name"]] in c["env"], c["name"]
            seen.add(c["name"])
    assert seen == {"triton", "openai"}
    leader = pods[0]["spec"]["containers"][0]
    args = expanded(leader["command"][2], {"PATH": "/usr/bin:/bin", TRITON_ADMIN_KEY_ENV: SENTINEL}).stdout
    # every rank (mpirun's tritonserver processes) restricted
    assert args.split("\0").count(triton_restricted_argv(SENTINEL)[0]) == tp * pp


def test_the_secret_command_makes_random_keys_and_names_what_the_pods_read(tmp_path):
    cmd = secret_command("b")
    assert cmd.startswith("kubectl create secret generic b-keys ")
    for key in SECRET_KEYS.values():
        assert f'--from-literal={key}="$(openssl rand -hex 32)"' in cmd
    plan = plan_deployment(load_spec(DEFAULT, "cpu"), get_target("cpu"), tmp_path / "out")
    files = render_deployment(plan)
    assert cmd.replace("b-keys", secret_name(plan.name)) in files["k8s/deployment.yaml"]
    assert f"export {TRITON_ADMIN_KEY_ENV}=$(openssl rand -hex 32)" in files["docker-compose.yaml"]


def test_no_key_value_reaches_a_generated_file(tmp_path, monkeypatch):
    """With both keys set in the environment the files are generated from, none of them holds either value: every
    file of a Triton, a bundle and a trtllm-llmapi deployment, the bundle's script and the Dynamo files."""
    monkeypatch.setenv(TRITON_ADMIN_KEY_ENV, SENTINEL)
    monkeypatch.setenv(FRONTEND_API_KEY_ENV, SENTINEL)
    texts = {}
    for runtime in ("pytorch", "trtllm", "trtllm-llmapi"):
        build = (load_spec(DEFAULT, "cpu") if runtime == "pytorch" else _gpu_build(tmp_path / runtime, runtime=runtime))
        target = get_target("cpu" if runtime == "pytorch" else "h100")
        for rel, text in render_deployment(plan_deployment(build, target, tmp_path / runtime / "out")).items():
            texts[f"{runtime}/{rel}"] = text
    bundle = tmp_path / "bundled"
    (bundle / "bundle").mkdir(parents=True)
    plan = plan_deployment(_gpu_build(tmp_path / "b2"), get_target("h100"), bundle)
    texts.update({f"bundle/{k}": v for k, v in render_deployment(plan).items()})
    assert plan.served_from == "bundle"
    assert compose(plan)["services"]["triton"]["environment"][TRITON_ADMIN_KEY_ENV] is None
    argv = leader_mode_argv(2, "/r", http_port="${HTTP_PORT}", grpc_port="${GRPC_PORT}", metrics_port="${M}",
                            admin_key=f"${{{TRITON_ADMIN_KEY_ENV}}}")
    texts["leader argv"] = " ".join(argv)
    assert len(texts) > 15
    for name, text in texts.items():
        assert SENTINEL not in text, name
    assert any("restricted" in t and f"{TRITON_ADMIN_KEY_ENV}" in t for t in texts.values())


def test_the_bundle_script_restricts_triton_and_demands_a_key_beyond_loopback():
    from builders.spec import LimitsConfig
    from model_repo.bundle import render_script

    serve = leader_mode_argv(1, "@BUNDLE@/model_repo", http_port="${HTTP_PORT}", grpc_port="${GRPC_PORT}",
                             metrics_port="${METRICS_PORT}", address="${ADDRESS}", tritonserver="${TRITONSERVER}",
                             admin_key=f"${{{TRITON_ADMIN_KEY_ENV}}}")
    script = render_script(name="b", target="h100", planned_dir=REPO, world_size=1, build_argv=["trtllm-build"],
                           serve=serve, limits=LimitsConfig(), ports=(1, 2, 3))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    body = script.split("serve() {", 1)[1].split("\n}\n", 1)[0]
    # run the key checks of serve() alone: the lines before `echo "starting`, then print what exec would get
    checks = body.split('  echo "starting')[0].split("  ADDRESS=", 1)[1]
    prog = ("die() { echo \"error: $*\" >&2; exit 2; }\nADDRESS=" + checks +
            "\nprintf '%s\\0' \"${TRITON_ADMIN_KEY}\"\n")
    env = {"PATH": "/usr/bin:/bin"}
    public = subprocess.run(["bash", "-c", prog], env={**env, "ADDRESS": "0.0.0.0"}, capture_output=True, text=True)
    assert public.returncode == 2 and "set TRITON_ADMIN_KEY" in public.stderr
    local = subprocess.run(["bash", "-c", prog], env=env, capture_output=True, text=True)
    generated = local.stdout.rstrip("\0")
    assert local.returncode == 0 and len(generated) == 64 and SENTINEL not in local.stdout + local.stderr
    given = subprocess.run(["bash", "-c", prog], env={**env, "ADDRESS": "0.0.0.0", TRITON_ADMIN_KEY_ENV: SENTINEL},
                           capture_output=True, text=True)
    assert given.returncode == 0 and given.stdout == SENTINEL + "\0"
    bad = subprocess.run(["bash", "-c", prog], env={**env, TRITON_ADMIN_KEY_ENV: "a:b"}, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "hex key" in bad.stderr
    assert '"--http-restricted-api=model-repository,shared-memory,trace,logging:admin-key=${TRITON_ADMIN_KEY}"' \
        in script


def test_the_recorded_options_are_the_binarys():
    """tritonserver 2.51's own --help names both options and every recorded group; the comma form its help text
    shows is refused, with the colon form's format in the message (what made the files use the colon form)."""
    from pipeline.serve import tritonserver_binary

    facts = json.loads(FACTS.read_text())
    binary = str(tritonserver_binary())
    text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    help_text = " ".join((text.stdout + text.stderr).split())
    for option in facts["options"]:
        assert option in help_text
    assert all(g in help_text for g in facts["api_groups"])
    comma = subprocess.run([binary, "--model-repository=/nonexistent", "--http-restricted-api=model-repository,k=v"],
                           capture_output=True, text=True, timeout=60)
    assert "option format is '<config name>:<setting>=<value>'" in comma.stdout + comma.stderr


def test_the_other_openai_servers_recorded_without_a_key_option():
    """The claims of the facts' ``others``: trtllm-serve 1.2.1's recorded options and Dynamo 1.6.1's frontend
    arguments (the wheel's frontend_args.py in .dynamo/) name no key."""
    llm_args = json.loads((REPO / "tests" / "facts" / "trtllm_1_2_1" / "llm_args.json").read_text())
    assert not [o for o in llm_args["trtllm_serve"]["options"] if "key" in o.lower()]
    found = list((REPO / ".dynamo").glob("lib/python3*/site-packages/dynamo/frontend/frontend_args.py"))
    assert found, "ai-dynamo 1.6.1 is not installed in .dynamo/: run `make setup`"
    text = found[0].read_text()
    assert "--http-port" in text and "api-key" not in text and "api_key" not in text
