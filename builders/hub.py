"""Hugging Face Hub sources: ``model.source: <org>/<name>`` (with ``model.revision``) downloaded through
huggingface_hub's own client and cache.

Everything goes through huggingface_hub 2.4.0 (no HTTP of ours): ``HfApi.resolve_revision`` pins the branch or tag
to a commit (and writes the cache's ``refs/``), ``HfApi.model_info(files_metadata=True)`` lists the commit's files
with their sizes and hashes, ``snapshot_download(allow_patterns=...)`` fetches only what a build reads and
``hf_hub_download`` fetches ``config.json`` alone for ``trtpipe plan``. The library's settings are the user's:
``HF_ENDPOINT`` (a mirror), ``HF_TOKEN``, ``HF_HOME`` / ``HF_HUB_CACHE`` (the cache:
``models--<org>--<name>/{blobs,refs,snapshots}``), ``HF_HUB_OFFLINE`` (the cache only). Facts this module relies on
are recorded in tests/facts/huggingface_hub_2_4_0/hub.json and checked against the installed library.

What the library does on an interrupted download (huggingface_hub 2.4.0 file_download.py): a connection that breaks
mid-file is resumed in the same call with a ``Range: bytes=<n>-`` request (``http_get``, up to 5 tries); a file is
written to a process-unique ``<etag>.<uuid>.incomplete`` and renamed into ``blobs/`` when whole, and a partial one
is deleted when the call fails, so a rerun after a failure keeps every completed file and fetches only the rest.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from plugins.errors import PipelineError, Problem, SpecError, StageError, WriteError

log = logging.getLogger("trtpipe")

HUB_ID = re.compile(r"(\b[\w\-.]{1,96}\b)/(\b[\w\-.]{1,96}\b)", re.ASCII)
"""``<org>/<name>``: huggingface_hub 2.4.0 utils/_validators.py ``REPO_ID_REGEX`` with the namespace required (a bare
name would read as a local folder), plus ``validate_repo_id``'s rules: no ``--`` or ``..``, no ``.git`` ending."""

NEEDED_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
                "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
                "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json", "hf_quant_config.json")
"""Top-level files a build reads beside the weights (builders.model_fetch.copy_tokenizer, the loaders;
``hf_quant_config.json``: a ModelOpt-quantized checkpoint's recipe, the one file TensorRT-LLM 1.2.1 reads it from,
builders.prequant)."""
NEEDED_PATTERNS = ("*.safetensors", "*.py")
"""Top-level weights (safetensors only) and the checkpoint's own code (``auto_map``; it runs only with
``model.trust_remote_code: true``)."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Weights in pickle files: never downloaded (``torch.load`` of a pickle can run code from the file)."""
DISK_MARGIN = 1.05
"""Free space asked for beyond the download's size (5%): the filesystem's blocks and the files written next."""


def is_hub_id(source: str) -> bool:
    """True when ``source`` has the hub's repository-id form ``<org>/<name>`` (:data:`HUB_ID`). Whether a local
    folder of that name exists is the caller's question (builders.spec.load_spec: relative to the build file)."""
    if not isinstance(source, str) or source.startswith(("embedded:", ".", "/", "~")):
        return False
    return (HUB_ID.fullmatch(source) is not None and "--" not in source and ".." not in source
            and not source.endswith(".git"))


def is_hub_source(source: str) -> bool:
    """True when ``source`` (as builders.spec.load_spec leaves it, or as typed to ``trtpipe fetch``) names a hub
    repository: the ``<org>/<name>`` form and no folder of that name here."""
    return is_hub_id(source) and not Path(source).exists()


def _hf():
    """huggingface_hub with the submodules used here imported (its ``__init__`` loads names lazily)."""
    import huggingface_hub
    import huggingface_hub.constants
    import huggingface_hub.errors
    import huggingface_hub.file_download
    import huggingface_hub.utils

    # its logger prints its own warnings (retries) through its own handler: not again through the root's
    huggingface_hub.utils.logging.disable_propagation()
    return huggingface_hub


def endpoint() -> str:
    """The hub the client talks to (``HF_ENDPOINT``, default https://huggingface.co), as huggingface_hub reads it."""
    return _hf().constants.ENDPOINT


def cache_dir() -> Path:
    """huggingface_hub's cache folder (``HF_HUB_CACHE``, default ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``)."""
    return Path(_hf().constants.HF_HUB_CACHE).expanduser()


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as huggingface_hub reads it."""
    return bool(_hf().constants.is_offline_mode())


def _rev(revision: str | None) -> str:
    return revision or "main"


# -- errors ----------------------------------------------------------------------------------------------------------

def hub_error(exc: BaseException, repo_id: str, revision: str | None, *, what: str = "download") -> PipelineError:
    """The project's error for an exception of huggingface_hub's: one message per cause, naming the fix.

    Mapped (huggingface_hub 2.4.0 errors.py and utils/_http.py ``hf_raise_for_status``): ``GatedRepoError``
    (``X-Error-Code: GatedRepo``) -> ``hub_gated``; ``RepositoryNotFoundError`` (``RepoNotFound``, or 401 on
    an https hub) -> ``hub_not_found``; ``RevisionNotFoundError`` (``RevisionNotFound``) -> ``hub_revision`` on
    ``model.revision``; an ``HfHubHTTPError`` with status 401 (``Invalid credentials in Authorization header``) ->
    ``hub_token``; 403 -> ``hub_forbidden``; offline mode without the files in the cache (``OfflineModeIsEnabled``,
    ``LocalEntryNotFoundError``, ``RevisionResolutionError`` while ``HF_HUB_OFFLINE`` is set) -> ``hub_offline``;
    a hub that cannot be reached (httpx2 transport errors, ``LocalEntryNotFoundError``,
    ``RevisionResolutionError``) -> ``hub_unreachable``; anything else from the hub -> StageError.

    Returns:
        SpecError (model.source / model.revision problems) or StageError; the caller raises it ``from exc``.
    """
    hf = _hf()
    errs = hf.errors
    ep = endpoint()
    page = f"{ep}/{repo_id}"
    local = (f"; no local folder named {repo_id} exists either (a relative model.source is a folder when one of that "
             "name exists beside the build file)") if not Path(repo_id).exists() else ""
    at = f" at revision {revision!r}" if revision else ""
    status = getattr(getattr(exc, "response", None), "status_code", None)

    def spec(rule: str, fix: str, code: str, field: str = "model.source", value: str = repo_id) -> SpecError:
        return SpecError([Problem(field, value, rule, fix, code=code)], what="the model source")

    if isinstance(exc, errs.GatedRepoError):
        return spec(f"{repo_id} is a gated repository on {ep}: its files need the license accepted by the account "
                    "whose token is sent", f"accept the license at {page} (signed in), then set HF_TOKEN to a read "
                    f"token of that account ({ep}/settings/tokens); or use a local folder", "hub_gated")
    if isinstance(exc, errs.RevisionNotFoundError):
        return spec(f"{repo_id} has no branch, tag or commit {revision!r} on {ep}",
                    f"set model.revision to a branch, tag or commit of {page}/tree/main (null: main)",
                    "hub_revision", field="model.revision", value=revision)
    if isinstance(exc, errs.RepositoryNotFoundError):
        return spec(f"no repository {repo_id} on {ep}, or it is private and the token sent has no access{local}",
                    f"check the name at {page}; for a private repository set HF_TOKEN to a token with access "
                    f"({ep}/settings/tokens); or point model.source at a local folder", "hub_not_found")
    if isinstance(exc, errs.HfHubHTTPError) and status == 401:
        return spec(f"{ep} refused the token sent (401 Invalid credentials): HF_TOKEN or the saved login "
                    "is not a valid token", f"set HF_TOKEN to a valid read token ({ep}/settings/tokens), or unset it "
                    "(and `hf auth logout`) for a public repository", "hub_token")
    if isinstance(exc, errs.HfHubHTTPError) and status == 403:
        return spec(f"{ep} answered 403 Forbidden for {repo_id}: the token has no read access to it",
                    f"give the token read access to {repo_id} ({ep}/settings/tokens; a fine-grained token needs "
                    "'read access to public gated repos'), or set HF_TOKEN to another token", "hub_forbidden")
    transport = (hf.utils.OfflineModeIsEnabled, errs.LocalEntryNotFoundError, errs.RevisionResolutionError,
                 errs.CachedRepoTreeNotFoundError, ConnectionError, TimeoutError)
    try:
        import httpx2

        transport = transport + (httpx2.TransportError,)
    except ImportError:  # pragma: no cover - huggingface_hub 2.4 depends on it
        pass
    if isinstance(exc, transport) and offline():
        return spec(f"HF_HUB_OFFLINE is set and the cache {cache_dir()} holds no complete copy of "
                    f"{repo_id}{at}{local}", "download it once with the network on (`trtpipe fetch "
                    f"{repo_id}`), point HF_HOME / HF_HUB_CACHE at the cache that holds it, unset HF_HUB_OFFLINE, "
                    "or use a local folder", "hub_offline")
    if isinstance(exc, transport):
        return spec(f"cannot reach {ep} to {what} {repo_id}{at}, and the cache {cache_dir()} has no copy of it "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}){local}",
                    "check the network or proxy (HTTPS_PROXY), set HF_ENDPOINT to a reachable mirror, set "
                    "HF_HUB_OFFLINE=1 to use a cache that holds it, or use a local folder", "hub_unreachable")
    if isinstance(exc, errs.HfHubHTTPError):
        return StageError(f"{ep} answered {status} for {repo_id}{at}: {str(exc).splitlines()[0]}. The hub may be "
                          "down: retry later, or set HF_ENDPOINT to a mirror")
    return StageError(f"could not {what} {repo_id}{at} from {ep}: {type(exc).__name__}: {exc}")


def _hub_exceptions() -> tuple[type[BaseException], ...]:
    hf = _hf()
    out: tuple = (hf.errors.HfHubHTTPError, hf.errors.LocalEntryNotFoundError, hf.errors.RevisionResolutionError,
                  hf.errors.CachedRepoTreeNotFoundError, hf.utils.OfflineModeIsEnabled, ConnectionError,
                  TimeoutError, hf.errors.FileMetadataError)
    try:
        import httpx2

        out = out + (httpx2.TransportError,)
    except ImportError:  # pragma: no cover
        pass
    return out


# -- what to download ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HubFile:
    """One file of a commit as the hub reports it.

    Attributes:
        path: path in the repository.
        size: bytes.
        blob_id: the git object id (sha1) of the file (of its LFS pointer for an LFS file).
        sha256: the LFS object's sha256 (the file's content hash; the cache's blob name), None for a git file.
    """

    path: str
    size: int | None
    blob_id: str | None
    sha256: str | None = None

    @property
    def etag(self) -> str | None:
        """The name huggingface_hub gives the file's blob in the cache: the LFS sha256, else the git blob id."""
        return self.sha256 or self.blob_id


def select_files(paths: list[str]) -> list[str]:
    """The files of a repository a build needs: top-level :data:`NEEDED_FILES`, ``*.safetensors`` and ``*.py``
    (:data:`NEEDED_PATTERNS`); never pickle weights or anything in subfolders (``original/``, ``onnx/`` ...).
    :func:`select_from_index` then drops safetensors files the index does not name."""
    top = [p for p in paths if "/" not in p]
    return sorted(p for p in top if p in NEEDED_FILES or any(fnmatch.fnmatch(p, pat) for pat in NEEDED_PATTERNS))


def select_from_index(selected: list[str], index: dict | None) -> list[str]:
    """``selected`` without the safetensors files an index does not name (a repository holding
    ``model-0000x-of-0000n.safetensors`` and a ``consolidated.safetensors`` copy: the build reads the shards)."""
    if not index or not isinstance(index.get("weight_map"), dict):
        return selected
    shards = set(index["weight_map"].values())
    return [p for p in selected if not p.endswith(".safetensors") or p in shards]


def check_files(repo_id: str, revision: str | None, paths: list[str], selected: list[str]) -> None:
    """Refuse, before anything is downloaded, a commit without config.json or safetensors weights.

    Raises:
        SpecError: ``model_pickle`` (pickle weights only), ``model_incomplete`` (no config.json, or no weights).
    """
    at = f" at {revision!r}" if revision else ""
    if not any(p.endswith(".safetensors") for p in selected):
        pickles = sorted(p for p in paths if p.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise SpecError([Problem("model.source", repo_id, f"the repository{at} holds pickle weights only "
                                     f"({', '.join(pickles[:3])}): loading a pickle can run code from the file, so "
                                     "trtpipe downloads safetensors only",
                                     "look for a safetensors conversion on the model page (often a pull request: "
                                     "model.revision: refs/pr/<n>), or convert it once where you trust the file "
                                     "(`AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, "
                                     "safe_serialization=True)`) and point model.source at that folder",
                                     code="model_pickle")], what="the model source")
        raise SpecError([Problem("model.source", repo_id, f"the repository{at} has no *.safetensors weights "
                                 f"(it holds {sorted(paths)[:10]})", "name a repository of a Hugging Face "
                                 "transformers checkpoint, or another revision", code="model_incomplete")],
                        what="the model source")
    if "config.json" not in selected:
        raise SpecError([Problem("model.source", repo_id, f"the repository{at} has no config.json",
                                 "name a repository of a Hugging Face transformers checkpoint",
                                 code="model_incomplete")], what="the model source")


def _free_bytes(path: Path) -> tuple[Path, int]:
    """(the nearest existing folder of ``path``, its free bytes: shutil.disk_usage)."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p, shutil.disk_usage(p).free


def check_disk(repo_id: str, files: list[HubFile], cache: Path) -> int:
    """Raise WriteError when the files not in the cache yet do not fit the cache's free space (with
    :data:`DISK_MARGIN`); return the bytes to download. Called before any download.

    Raises:
        WriteError: errno ENOSPC, naming the cache folder, the sizes and the fix.
    """
    blobs = cache / _hf().file_download.repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    need = sum(f.size or 0 for f in files if not (f.etag and (blobs / f.etag).is_file()))
    if need == 0:
        return 0
    where, free = _free_bytes(cache)
    if free < need * DISK_MARGIN:
        raise WriteError(f"{repo_id}: downloading {need / 1e9:.2f} GB needs {need * DISK_MARGIN / 1e9:.2f} GB free "
                         f"in the Hugging Face cache {cache}, and {where} has {free / 1e9:.2f} GB free. Fix: free "
                         "space there, or set HF_HUB_CACHE (or HF_HOME) to a folder on a larger disk",
                         path=cache, errno=errno.ENOSPC)
    return need


# -- download ----------------------------------------------------------------------------------------------------------

def _patterns(names: list[str]) -> list[str]:
    # snapshot_download matches allow_patterns with fnmatch: escape names that hold * ? [
    return [glob.escape(n) for n in names]


def _cached_listing(repo_id: str, commit: str) -> list[HubFile] | None:
    """The commit's files from huggingface_hub's on-disk tree listing (written by snapshot_download), or None."""
    tree = _tree_entries(repo_id, commit)
    return [HubFile(p, e.get("size"), e.get("blob_id"), e.get("lfs_sha256")) for p, e in tree.items()] or None


def _tree_entries(repo_id: str, commit: str) -> dict[str, dict]:
    """``trees/<commit>.json`` of the cache as {path: entry}, {} when absent (huggingface_hub 2.4.0 _tree_cache.py)."""
    hf = _hf()
    folder = cache_dir() / hf.file_download.repo_folder_name(repo_id=repo_id, repo_type="model")
    path = folder / "trees" / f"{commit}.json"
    try:
        return json.loads(path.read_text()).get("files", {})
    except (OSError, ValueError):
        return {}


def download(repo_id: str, revision: str | None = None, *, progress: bool = True) -> Path:
    """Download what a build needs of ``repo_id`` at ``revision`` into huggingface_hub's cache; return the snapshot
    folder ``<HF_HUB_CACHE>/models--<org>--<name>/snapshots/<commit>``.

    Online: the revision is resolved to a commit first (``HfApi.resolve_revision``), the commit's file list
    (``model_info(files_metadata=True)``) is checked (:func:`check_files`: safetensors and config.json, refused
    before downloading when the weights are pickles only) and the size of what is not cached yet is checked
    against the cache's free disk (:func:`check_disk`), then ``snapshot_download`` fetches the
    :func:`select_files` files (a progress bar unless ``progress`` is false or ``HF_HUB_DISABLE_PROGRESS_BARS``
    is set). Offline (``HF_HUB_OFFLINE=1``) or with the hub unreachable, the cached snapshot is used.

    Args:
        repo_id: ``<org>/<name>``.
        revision: branch, tag or commit (None: ``main``).
        progress: show huggingface_hub's progress bar.

    Raises:
        SpecError: gated, missing repository or revision, bad token, offline without the files, hub unreachable
            (:func:`hub_error`), pickle-only or incomplete repository (:func:`check_files`).
        WriteError: not enough free disk in the cache (before any download).
        StageError: the hub answered another error.
    """
    hf = _hf()
    api = hf.HfApi()
    old = _cached_ref(repo_id, _rev(revision))
    try:
        resolved = api.resolve_revision(repo_id, revision=revision)  # offline or unreachable: the cache's refs/
    except _hub_exceptions() as exc:
        raise hub_error(exc, repo_id, revision) from exc
    commit = resolved.resolved
    files: list[HubFile] | None = None
    if not offline():
        try:
            info = api.model_info(repo_id, revision=commit, files_metadata=True)
            files = [HubFile(s.rfilename, s.size, s.blob_id, s.lfs.sha256 if s.lfs else None)
                     for s in info.siblings or []]
        except _hub_exceptions() as exc:
            if not isinstance(exc, (hf.errors.HfHubHTTPError,)) or getattr(exc.response, "status_code", 0) >= 500:
                log.warning("%s: the hub cannot be reached (%s): using the cached snapshot", repo_id,
                            type(exc).__name__)
            else:
                raise hub_error(exc, repo_id, revision) from exc
    if files is None:
        files = _cached_listing(repo_id, commit)
    patterns = None
    if files is not None:
        paths = [f.path for f in files]
        selected = select_files(paths)
        check_files(repo_id, revision, paths, selected)
        if "model.safetensors.index.json" in selected and not offline():
            selected = select_from_index(selected, _read_index(repo_id, resolved))
        patterns = _patterns(selected)
        if not offline():
            check_disk(repo_id, [f for f in files if f.path in set(selected)], cache_dir())
    if old and old != commit and not (revision and hf.file_download.REGEX_COMMIT_HASH.fullmatch(revision)):
        log.info("%s: revision %r now resolves to commit %s (the cache had %s)", repo_id, _rev(revision), commit,
                    old)
    bars = hf.utils.are_progress_bars_disabled()
    if not progress:
        hf.utils.disable_progress_bars()
    try:
        folder = hf.snapshot_download(repo_id, revision=resolved, allow_patterns=patterns, local_files_only=offline())
    except _hub_exceptions() as exc:
        raise hub_error(exc, repo_id, revision) from exc
    finally:
        if not progress and not bars:
            hf.utils.enable_progress_bars()
    folder = Path(folder)
    if files is None and not any(folder.glob("*.safetensors")):  # only config.json cached (by `trtpipe plan`)
        raise hub_error(hf.errors.LocalEntryNotFoundError(f"{folder} holds no weights"), repo_id, revision)
    return folder


def _read_index(repo_id: str, resolved) -> dict | None:
    hf = _hf()
    try:
        path = hf.hf_hub_download(repo_id, "model.safetensors.index.json", revision=resolved)
        return json.loads(Path(path).read_text())
    except _hub_exceptions() as exc:
        raise hub_error(exc, repo_id, str(resolved)) from exc
    except (OSError, ValueError):
        return None


def _cached_ref(repo_id: str, revision: str) -> str | None:
    """The commit the cache's ``refs/<revision>`` held before this download (None: none)."""
    hf = _hf()
    ref = cache_dir() / hf.file_download.repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / revision
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def fetch_config(repo_id: str, revision: str | None = None) -> dict:
    """``config.json`` of ``repo_id`` at ``revision``, downloading that file alone (``hf_hub_download``; from the
    cache when offline). ``_name_or_path`` is set to ``repo_id``.

    Raises:
        SpecError / StageError: as :func:`download` (:func:`hub_error`); ``model_incomplete`` when the repository
            has no config.json.
    """
    hf = _hf()
    try:
        path = hf.hf_hub_download(repo_id, "config.json", revision=revision)
    except hf.errors.RemoteEntryNotFoundError as exc:
        raise SpecError([Problem("model.source", repo_id, f"the repository has no config.json at "
                                 f"{_rev(revision)!r}", "name a repository of a Hugging Face transformers "
                                 "checkpoint", code="model_incomplete")], what="the model source") from exc
    except _hub_exceptions() as exc:
        raise hub_error(exc, repo_id, revision, what="read config.json of") from exc
    cfg = json.loads(Path(path).read_text())
    cfg.setdefault("_name_or_path", repo_id)
    return cfg


# -- what the manifest records ---------------------------------------------------------------------------------------

def snapshot_record(folder: Path, revision: str | None = None) -> dict:
    """What the manifest records of a hub snapshot folder, read from huggingface_hub's cache layout
    (``models--<org>--<name>/snapshots/<commit>/<file>`` -> ``../../blobs/<etag>``; ``trees/<commit>.json``).

    Returns:
        ``{"repo_id", "revision" (as requested; null: main), "commit", "endpoint", "files": {path: {"size",
        "etag" (the blob name: the LFS sha256, or the git blob id of a file in git), "sha256" (LFS files: the
        content's sha256 as the hub reports it), "git_oid"}}}``.
    """
    folder = Path(folder)
    commit = folder.name
    repo_id = folder.parent.parent.name.split("--", 1)[1].replace("--", "/")
    tree = _tree_entries(repo_id, commit)
    files = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        entry = tree.get(rel) or {}
        etag = Path(os.readlink(f)).name if f.is_symlink() else (entry.get("lfs_sha256") or entry.get("blob_id"))
        files[rel] = {"size": f.stat().st_size, "etag": etag, "sha256": entry.get("lfs_sha256"),
                      "git_oid": entry.get("blob_id")}
    return {"repo_id": repo_id, "revision": revision, "commit": commit, "endpoint": endpoint(), "files": files}


def moved_message(previous: dict | None, record: dict) -> str | None:
    """A sentence when ``record`` (:func:`snapshot_record`) is the same repository and revision as ``previous``
    (the last build's ``manifest["source_checkpoint"]``) at another commit; None otherwise."""
    if not previous or previous.get("repo_id") != record["repo_id"] or previous.get("revision") != record["revision"]:
        return None
    old, new = previous.get("commit"), record["commit"]
    if not old or old == new:
        return None
    return (f"model.source {record['repo_id']}: revision {_rev(record['revision'])!r} now resolves to commit {new}; "
            f"the previous build of this folder used commit {old}. This build is of the new commit (its stages "
            f"rebuild); to rebuild the old one, set model.revision: {old}")
