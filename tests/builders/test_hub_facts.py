"""tests/facts/huggingface_hub_2_4_0/hub.json against the installed huggingface_hub: the functions builders.hub
calls, the environment variables and what they set, the cache layout, the headers, the errors and the headers
and status that trigger each. A new release that changes any of them fails here, before builders.hub or
tests/hub_double.py silently drift from the library."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FACTS = json.loads((REPO / "tests" / "facts" / "huggingface_hub_2_4_0" / "hub.json").read_text())


def test_version_is_the_recorded_one():
    import huggingface_hub

    assert huggingface_hub.__version__ == FACTS["version"]


@pytest.mark.parametrize("name", sorted(FACTS["functions"]))
def test_functions_take_the_recorded_parameters(name):
    fact = FACTS["functions"][name]
    obj = importlib.import_module(fact["module"])
    for part in name.split("."):
        obj = getattr(obj, part, None) or getattr(importlib.import_module("huggingface_hub.file_download"), part)
    params = set(inspect.signature(obj).parameters)
    assert set(fact["parameters"]) <= params, set(fact["parameters"]) - params
    assert Path(inspect.getsourcefile(inspect.unwrap(obj))).name == fact["file"]


def _constants(monkeypatch, **env):
    """huggingface_hub's constants.py executed under ``env`` (what a fresh process reads)."""
    import huggingface_hub.constants as constants

    for k in ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE",
              "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DOWNLOAD_TIMEOUT",
              "HF_HUB_ETAG_TIMEOUT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("_hf_constants_facts", constants.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_environment_variables_set_the_recorded_constants(monkeypatch, tmp_path):
    env = FACTS["environment"]
    default = _constants(monkeypatch)
    assert default.ENDPOINT == env["HF_ENDPOINT"]["default"]
    assert default.HF_HUB_OFFLINE is env["HF_HUB_OFFLINE"]["default"]
    assert default.HF_HUB_DISABLE_PROGRESS_BARS is env["HF_HUB_DISABLE_PROGRESS_BARS"]["default"]
    assert default.HF_HUB_DOWNLOAD_TIMEOUT == env["HF_HUB_DOWNLOAD_TIMEOUT"]["default"]
    assert default.HF_HUB_ETAG_TIMEOUT == env["HF_HUB_ETAG_TIMEOUT"]["default"]
    assert default.HF_HOME == str(Path.home() / ".cache" / "huggingface")
    assert _constants(monkeypatch, XDG_CACHE_HOME=str(tmp_path)).HF_HOME == str(tmp_path / "huggingface")
    c = _constants(monkeypatch, HF_ENDPOINT="http://mirror.example/", HF_HOME=str(tmp_path / "h"), HF_HUB_OFFLINE="1")
    assert c.ENDPOINT == "http://mirror.example"  # trailing / dropped
    assert c.HUGGINGFACE_CO_URL_TEMPLATE.startswith("http://mirror.example/")
    assert c.HF_HUB_CACHE == str(tmp_path / "h" / "hub") and c.HF_TOKEN_PATH == str(tmp_path / "h" / "token")
    assert c.HF_HUB_OFFLINE is True
    assert _constants(monkeypatch, TRANSFORMERS_OFFLINE="1").HF_HUB_OFFLINE is True  # the "also"
    assert _constants(monkeypatch, HF_HUB_CACHE=str(tmp_path / "c")).HF_HUB_CACHE == str(tmp_path / "c")


def test_hf_token_is_read_at_each_request(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants
    from huggingface_hub.utils import get_token

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_one")
    assert get_token() == "hf_one"
    monkeypatch.setenv("HF_TOKEN", "hf_two")
    assert get_token() == "hf_two"


def test_cache_layout_and_headers():
    import huggingface_hub.constants as constants
    from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name

    layout = FACTS["cache_layout"]
    assert repo_folder_name(repo_id="org/name", repo_type="model") == layout["repo_folder"].format(org="org",
                                                                                                   name="name")
    assert constants.REPO_ID_SEPARATOR == layout["separator"]
    assert REGEX_COMMIT_HASH.pattern == FACTS["commit_regex"]
    for name, value in FACTS["headers"].items():
        if name.isupper():
            assert getattr(constants, name) == value
    src = inspect.getsource(importlib.import_module("huggingface_hub.file_download"))
    assert 'os.path.join(storage_folder, "blobs", etag)' in src and '"refs", revision' in src
    assert 'f"{incomplete_path.stem}.{uuid.uuid4().hex[:8]}.incomplete"' in src
    tree = inspect.getsource(importlib.import_module("huggingface_hub._tree_cache"))
    assert '"trees"' in tree


def test_resume_is_a_range_request_within_one_call():
    import huggingface_hub.constants as constants
    from huggingface_hub import file_download

    fact = FACTS["resume"]
    src = inspect.getsource(getattr(file_download, fact["function"].split(".")[-1]))
    assert 'headers["Range"] = _adjust_range_header(headers.get("Range"), resume_size)' in src
    for exc in fact["on"]:
        assert exc in src
    assert f"_nb_retries: int = {fact['retries']}" in src and f"time.sleep({fact['sleep_s']})" in src
    assert constants.DOWNLOAD_CHUNK_SIZE == int(fact["chunk"].split("= ")[1].split()[0])
    from huggingface_hub.file_download import _adjust_range_header

    assert _adjust_range_header(None, 123) == "bytes=123-"
    move = inspect.getsource(file_download._download_to_tmp_and_move)
    assert "tmp_path.unlink(missing_ok=True)" in move  # a partial file does not outlive a failed call


@pytest.mark.parametrize("fact", FACTS["errors"], ids=lambda f: f"{f['class']}-{f['status']}")
def test_errors_come_from_the_recorded_headers_and_status(fact):
    import httpx2
    from huggingface_hub import errors
    from huggingface_hub.utils import hf_raise_for_status

    cls = getattr(errors, fact["class"])
    assert getattr(errors, fact["base"], None) in cls.__mro__ or fact["base"] in [c.__name__ for c in cls.__mro__]
    for url in ("http://127.0.0.1:1/api/models/org/name/revision/main",  # the hub double's http endpoint
                "https://huggingface.co/org/name/resolve/main/config.json"):
        response = httpx2.Response(fact["status"], headers=fact["headers"], request=httpx2.Request("GET", url))
        with pytest.raises(errors.HfHubHTTPError) as err:
            hf_raise_for_status(response)
        assert type(err.value) is cls and err.value.response.status_code == fact["status"]


def test_401_on_an_https_repo_url_is_repository_not_found():
    import httpx2
    from huggingface_hub import errors
    from huggingface_hub.utils import hf_raise_for_status

    response = httpx2.Response(401, request=httpx2.Request("GET", "https://huggingface.co/api/models/org/name"))
    with pytest.raises(errors.RepositoryNotFoundError):
        hf_raise_for_status(response)


def test_offline_error_classes():
    from huggingface_hub import errors, utils

    assert issubclass(utils.OfflineModeIsEnabled, ConnectionError)
    for name in FACTS["offline_errors"]:
        assert hasattr(errors, name)
    assert issubclass(errors.IncompleteSnapshotError, errors.LocalEntryNotFoundError)


def test_repo_id_grammar_is_the_validators():
    from huggingface_hub.utils import _validators

    from builders import hub

    fact = FACTS["repo_id"]
    flags = re.VERBOSE | re.ASCII
    assert _validators.REPO_ID_REGEX.flags & flags == flags
    stripped = re.sub(r"#.*", "", _validators.REPO_ID_REGEX.pattern)
    assert re.sub(r"\s+", "", stripped) == fact["regex"]
    samples = ["org/name", "a_b/c.d-e", "-org/name", "org/name-", "org/caf\u00e9", "o/" + "n" * 96, "o/" + "n" * 97,
               "org/.name", "org/name.", "x/y"]
    for s in samples:  # builders.hub's <org>/<name> is the validator's grammar with the namespace required
        assert bool(hub.HUB_ID.fullmatch(s)) == bool(_validators.REPO_ID_REGEX.fullmatch(s)), s
