"""Hub sources (builders.hub) against huggingface_hub 2.4.0's real client and a local hub double.

No test reaches the network: tests/hub_double.py serves a tiny repository with the hub's file API on 127.0.0.1, and
huggingface_hub is pointed at it through its own settings (``HF_ENDPOINT``, ``HF_HOME``, ``HF_TOKEN``,
``HF_HUB_OFFLINE``). The library reads its environment once, at import (constants.py); :func:`use_hub` sets the
variables and has the library's own constants.py read them again (the values it derives are patched into
``huggingface_hub.constants`` for the test), and one test runs ``trtpipe fetch`` in a fresh process with the
variables alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from builders import hub
from builders.model_fetch import local_hf_config, resolve_source
from builders.spec import load_spec
from plugins.errors import SpecError, StageError, WriteError
from tests.hub_double import HubDouble, Repo, folder_files

REPO = Path(__file__).resolve().parents[2]
ENV = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
       "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_XET")


def use_hub(monkeypatch, home: Path, endpoint: str, **env: str) -> None:
    """Point huggingface_hub at ``endpoint`` with its home (cache, token file) in ``home``, plus ``env``: the
    variables are set, and the library's constants.py is executed again under them so that every value it derives
    at import (ENDPOINT, HUGGINGFACE_CO_URL_TEMPLATE, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN_PATH ...) is the one a
    fresh process would have; those are patched into ``huggingface_hub.constants`` until the test ends."""
    import huggingface_hub.constants as constants

    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("_hf_constants_again", constants.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    for name in dir(fresh):
        if name.isupper() and getattr(constants, name, None) != getattr(fresh, name):
            monkeypatch.setattr(constants, name, getattr(fresh, name))


@pytest.fixture(scope="module")
def tiny_files(tiny_llama) -> dict[str, bytes]:
    """A tiny Llama checkpoint as the hub would hold it: what a build needs, and what it must not fetch (a pickle
    copy of the weights, a README, a consolidated checkpoint in a subfolder)."""
    files = folder_files(tiny_llama)
    files.update({"pytorch_model.bin": b"\x80\x04pickle" * 100, "README.md": b"# tiny\n",
                  "original/consolidated.00.pth": b"\x80\x04pickle", ".gitattributes": b"*.safetensors filter=lfs\n"})
    return files


@pytest.fixture
def server(monkeypatch, tmp_path, tiny_files):
    """The hub double with ``org/tiny`` (one commit on main), huggingface_hub pointed at it, cache in tmp_path."""
    with HubDouble() as double:
        double.add(Repo("org/tiny")).commit(tiny_files)
        use_hub(monkeypatch, tmp_path / "hf", double.url)
        monkeypatch.chdir(tmp_path)  # no folder named org/... here
        yield double


def test_hub_id_recognised_as_the_hub_validates_it():
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    for good in ("org/name", "HuggingFaceTB/SmolLM2-135M-Instruct", "meta-llama/Llama-3.1-8B", "a_b/c.d-e"):
        assert hub.is_hub_id(good)
        validate_repo_id(good)
    for bad in ("name", "a/b/c", "./org/name", "/abs/path", "~/x/y", "embedded:smollm2-135m-instruct",
                "org/na--me", "org/na..me", "org/name.git", "-org/name", "org/name-", "org/caf\u00e9"):
        assert not hub.is_hub_id(bad), bad
        if bad.count("/") == 1 and not bad.startswith((".", "/", "~")):
            with pytest.raises(HFValidationError):
                validate_repo_id(bad)


def test_spec_keeps_hub_id_and_refuses_revision_elsewhere(tmp_path):
    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nmodel: {source: org/tiny, revision: v1}\ntargets: {cpu: {runtime: pytorch}}\n")
    b = load_spec(spec, "cpu")
    assert (b.model.source, b.model.revision) == ("org/tiny", "v1")
    (tmp_path / "org" / "tiny").mkdir(parents=True)  # a folder of that name beside the YAML file wins
    spec.write_text("name: b\nmodel: {source: org/tiny}\ntargets: {cpu: {runtime: pytorch}}\n")
    assert load_spec(spec, "cpu").model.source == str(tmp_path / "org" / "tiny")
    for source in ("org/tiny", "embedded:smollm2-135m-instruct"):
        spec.write_text(f"name: b\nmodel: {{source: '{source}', revision: main}}\ntargets: {{cpu: {{runtime: pytorch}}}}\n")
        with pytest.raises(SpecError) as err:
            load_spec(spec, "cpu")
        assert err.value.codes() == ["revision_not_hub"] and err.value.fields() == ["model.revision"]


def test_plan_fetches_config_json_alone(server, tmp_path, tiny_files):
    from pipeline.cli import main

    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nmodel: {source: org/tiny}\nquantization: {quant_algo: none}\n"
                    "limits: {max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"
                    "targets: {cpu: {runtime: pytorch}}\n")
    assert main(["plan", str(spec), "--target", "cpu", "--no-predict", "--output", str(tmp_path / "p.json")]) == 0
    assert server.downloads() == ["config.json"]
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["model"]["num_hidden_layers"] == json.loads(tiny_files["config.json"])["num_hidden_layers"]
    snap = next((tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
    assert sorted(os.listdir(snap)) == ["config.json"]


def test_download_fetches_only_what_a_build_needs(server, tiny_files):
    tiny_files["hf_quant_config.json"] = b'{"producer": {"name": "modelopt"}}'  # a ModelOpt checkpoint's recipe
    server.add(Repo("org/tiny-q")).commit(tiny_files)
    assert "hf_quant_config.json" in os.listdir(resolve_source("org/tiny-q", progress=False))
    del tiny_files["hf_quant_config.json"]
    folder = resolve_source("org/tiny", progress=False)
    got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert got == sorted(f for f in tiny_files if "/" not in f and not f.endswith((".bin", ".md", ".gitattributes")))
    assert not {"pytorch_model.bin", "README.md", "original/consolidated.00.pth"} & set(server.downloads())
    for name in got:  # the files are the repository's, byte for byte
        assert (folder / name).read_bytes() == tiny_files[name]
    assert folder.parent.parent == Path(hub.cache_dir()) / "models--org--tiny"  # the library's own cache


def test_pickle_only_repository_refused_before_download(server, tiny_files):
    files = {k: v for k, v in tiny_files.items() if not k.endswith(".safetensors")}
    server.add(Repo("org/pickled")).commit(files)
    with pytest.raises(SpecError) as err:
        resolve_source("org/pickled", progress=False)
    assert err.value.codes() == ["model_pickle"]
    assert "pytorch_model.bin" in str(err.value) and "refs/pr/" in str(err.value)
    assert server.downloads() == []


def test_pinned_revision_by_tag_branch_and_commit(server, tiny_files):
    repo = server.repos["org/tiny"]
    first = repo.refs["main"]
    repo.refs["v1"] = first
    config = json.dumps({**json.loads(tiny_files["config.json"]), "trtpipe_test": 2}).encode()
    newer = dict(tiny_files, **{"config.json": config})
    second = repo.commit(newer)  # main moves on
    for revision, commit in (("v1", first), (first, first), ("main", second), (None, second)):
        folder = resolve_source("org/tiny", revision, progress=False)
        assert folder.name == commit, revision
        assert (folder / "config.json").read_bytes() == (tiny_files if commit == first else newer)["config.json"]
        record = hub.snapshot_record(folder, revision)
        assert (record["repo_id"], record["revision"], record["commit"]) == ("org/tiny", revision, commit)
    weights = record["files"]["model.safetensors"]
    assert weights["sha256"] == weights["etag"] == hashlib.sha256(tiny_files["model.safetensors"]).hexdigest()
    assert record["files"]["config.json"]["etag"] == record["files"]["config.json"]["git_oid"]
    assert local_hf_config("org/tiny", "v1") == {**json.loads(tiny_files["config.json"]), "_name_or_path": "org/tiny"}


def test_unknown_revision_names_model_revision(server):
    with pytest.raises(SpecError) as err:
        resolve_source("org/tiny", "no-such-branch", progress=False)
    assert err.value.codes() == ["hub_revision"] and err.value.fields() == ["model.revision"]


def test_interrupted_download_resumes_with_a_range_request(server, tiny_files, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 20)  # bytes reach the file before the break
    size = len(tiny_files["model.safetensors"])
    assert size > 4 << 20
    server.drop_once.add("model.safetensors")  # half the body, then the connection closes
    folder = resolve_source("org/tiny", progress=False)
    gets = [(p, r) for m, p, r in server.requests if m == "GET" and p.endswith("/model.safetensors")]
    assert len(gets) == 2 and gets[0][1] is None
    start = int(gets[1][1].removeprefix("bytes=").rstrip("-"))
    assert 0 < start < size
    assert (folder / "model.safetensors").read_bytes() == tiny_files["model.safetensors"]


def test_failed_download_keeps_completed_files_for_the_next_run(server, tiny_files):
    server.fail.add("tokenizer.json")  # listed, but its download fails
    with pytest.raises(StageError):
        resolve_source("org/tiny", progress=False)
    assert "model.safetensors" in server.downloads()
    blobs = Path(hub.cache_dir()) / "models--org--tiny" / "blobs"
    assert not list(blobs.glob("*.incomplete"))
    server.fail.clear()
    server.requests.clear()
    folder = resolve_source("org/tiny", progress=False)
    assert "tokenizer.json" in server.downloads() and "model.safetensors" not in server.downloads()
    assert (folder / "model.safetensors").read_bytes() == tiny_files["model.safetensors"]


def test_offline_uses_the_cache_and_says_when_it_is_empty(server, tmp_path, monkeypatch):
    folder = resolve_source("org/tiny", progress=False)
    use_hub(monkeypatch, tmp_path / "hf", server.url, HF_HUB_OFFLINE="1")
    server.requests.clear()
    assert resolve_source("org/tiny", progress=False) == folder
    assert local_hf_config("org/tiny")["_name_or_path"] == "org/tiny"
    assert server.requests == []
    use_hub(monkeypatch, tmp_path / "config-only", server.url)  # what `trtpipe plan` leaves: config.json alone
    local_hf_config("org/tiny")
    use_hub(monkeypatch, tmp_path / "config-only", server.url, HF_HUB_OFFLINE="1")
    server.requests.clear()
    with pytest.raises(SpecError) as err:
        resolve_source("org/tiny", progress=False)
    assert err.value.codes() == ["hub_offline"]
    use_hub(monkeypatch, tmp_path / "empty", server.url, HF_HUB_OFFLINE="1")
    for call in (lambda: resolve_source("org/tiny", progress=False), lambda: local_hf_config("org/tiny")):
        with pytest.raises(SpecError) as err:
            call()
        assert err.value.codes() == ["hub_offline"] and "HF_HUB_OFFLINE" in str(err.value)
    assert server.requests == []


def test_gated_repository_names_the_license_page_and_token(server, tiny_files, monkeypatch):
    repo = server.add(Repo("org/gated", gated=True))
    repo.commit(tiny_files)
    for call in (lambda: resolve_source("org/gated", progress=False), lambda: local_hf_config("org/gated")):
        with pytest.raises(SpecError) as err:
            call()
        assert err.value.codes() == ["hub_gated"]
        assert f"{server.url}/org/gated" in str(err.value) and "HF_TOKEN" in str(err.value)
    server.tokens.add("hf_granted")  # the fix it names works
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    assert (resolve_source("org/gated", progress=False) / "model.safetensors").is_file()


def test_missing_repository_says_no_folder_either(server):
    with pytest.raises(SpecError) as err:
        resolve_source("org/missing", progress=False)
    assert err.value.codes() == ["hub_not_found"]
    assert "no local folder named org/missing" in str(err.value) and f"{server.url}/org/missing" in str(err.value)


def test_bad_token_names_hf_token(server, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_token")
    with pytest.raises(SpecError) as err:
        resolve_source("org/tiny", progress=False)
    assert err.value.codes() == ["hub_token"] and "HF_TOKEN" in str(err.value)


def test_unreachable_hub_names_the_ways_out(tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    use_hub(monkeypatch, tmp_path / "hf", f"http://127.0.0.1:{port}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as err:
        resolve_source("org/tiny", progress=False)
    assert err.value.codes() == ["hub_unreachable"]
    assert all(w in str(err.value) for w in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "local folder"))


def test_not_enough_disk_fails_before_any_download(server, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(WriteError) as err:
        resolve_source("org/tiny", progress=False)
    assert "HF_HUB_CACHE" in str(err.value) and str(hub.cache_dir()) in str(err.value)
    assert server.downloads() == [] and not [r for r in server.requests if r[0] == "HEAD"]


def test_cli_fetch_in_a_fresh_process_reads_the_environment(server, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    env.update(HF_ENDPOINT=server.url, HF_HOME=str(tmp_path / "fresh"), HF_HUB_DISABLE_PROGRESS_BARS="1",
               PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "fetch", "org/tiny", "--revision", "main"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    folder = Path(out.stdout.strip().splitlines()[-1])
    assert folder.parent.parent == tmp_path / "fresh" / "hub" / "models--org--tiny"
    assert (folder / "model.safetensors").is_file()


def test_build_records_the_commit_and_says_when_the_branch_moved(server, tmp_path, tiny_files, caplog):
    """End to end: run_build on a hub id up to the checkpoint stage; main moves; the rebuild says so."""
    from pipeline.build import run_build

    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nmodel: {source: org/tiny}\ndtype: float16\n"
                    "quantization: {quant_algo: none}\n"
                    "limits: {max_batch_size: 2, max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}\n"
                    "targets: {cpu: {runtime: pytorch}}\n")
    build = load_spec(spec, "cpu")
    repo = server.repos["org/tiny"]
    first = repo.refs["main"]
    manifest = run_build(build, out_root=tmp_path / "out", progress=False, stop_after="checkpoint")
    src = manifest["source_checkpoint"]
    assert (src["repo_id"], src["revision"], src["commit"]) == ("org/tiny", None, first)
    assert src["files"]["model.safetensors"]["sha256"] == hashlib.sha256(tiny_files["model.safetensors"]).hexdigest()
    assert "pytorch_model.bin" not in src["files"] and "previous_commit" not in src
    assert manifest["model_source"] == "org/tiny"

    second = repo.commit(dict(tiny_files, **{"generation_config.json": b'{"bos_token_id": 1, "eos_token_id": 2}'}))
    with caplog.at_level(logging.WARNING, logger="trtpipe"):
        manifest = run_build(build, out_root=tmp_path / "out", progress=False, stop_after="checkpoint")
    src = manifest["source_checkpoint"]
    assert (src["commit"], src["previous_commit"]) == (second, first)
    said = [r.getMessage() for r in caplog.records if "now resolves to commit" in r.getMessage()]
    assert said and first in said[-1] and second in said[-1] and "model.revision" in said[-1]
