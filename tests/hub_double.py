"""Test double of the Hugging Face Hub's file API, for huggingface_hub 2.4.0's real client.

The one thing the tests cannot run here is the hub itself. This stdlib HTTP server answers the requests
huggingface_hub 2.4.0 makes (read from its source, recorded in tests/facts/huggingface_hub_2_4_0/hub.json):

* ``GET /api/models/{repo_id}[/revision/{revision}][?blobs=True]`` (``HfApi.model_info``/``repo_info``,
  hf_api.py): ``{"id", "sha", "gated", "private", "siblings": [{"rfilename", "size", "blobId", "lfs":
  {"sha256", "size", "pointerSize"}}]}``.
* ``GET /api/models/{repo_id}/tree/{revision}?recursive=True`` (``HfApi.list_repo_tree``, called by
  ``snapshot_download``): ``[{"type": "file", "path", "size", "oid", "lfs": {"oid", "size", "pointerSize"}}]``,
  one page (no ``Link`` header).
* ``HEAD /{repo_id}/resolve/{revision}/{path}`` (``get_hf_file_metadata``, file_download.py): 200 with
  ``X-Repo-Commit``, ``ETag`` (the git blob id, or for an LFS file the LFS sha256, as the hub's ``X-Linked-Etag``
  and ``X-Linked-Size``) and ``Content-Length``. No ``X-Xet-Hash``: the client takes the plain HTTP path.
* ``GET /{repo_id}/resolve/{revision}/{path}`` (``http_get``), honouring ``Range: bytes=N-`` with 206 and
  ``Content-Range`` (how the client resumes).

Errors as the hub sends them and ``hf_raise_for_status`` (utils/_http.py) reads them: a missing repository is 401
``X-Error-Code: RepoNotFound``; a gated repository's files without accepted access are 403 ``X-Error-Code:
GatedRepo`` (its API metadata stays public, ``"gated": "manual"``); an unknown revision is 404 ``X-Error-Code:
RevisionNotFound``; a missing file is 404 ``X-Error-Code: EntryNotFound``; a token the hub does not know is 401
``X-Error-Message: Invalid credentials in Authorization header``.

Knobs for tests: :attr:`HubDouble.drop_once` (file names whose next GET sends half the body and closes the
connection), :attr:`HubDouble.fail` (file names answered 404 EntryNotFound while listed), :attr:`HubDouble.tokens`
(the tokens the server knows; a gated repository lets those in), and :attr:`HubDouble.requests` (every request:
method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
"""Files the double stores as Git LFS objects (the hub's default .gitattributes tracks these)."""


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob (sha1 of ``blob <len>\\0`` + content): the hub's ``oid``/``ETag`` of a file
    stored in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The Git LFS pointer file git stores in place of an LFS file (its size is ``pointerSize``)."""
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


@dataclass
class Repo:
    """One model repository: commits (sha -> {path: bytes}), refs (branch/tag -> sha), gated or not."""

    repo_id: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False

    def commit(self, files: dict[str, bytes], *, branch: str = "main", tags: tuple[str, ...] = ()) -> str:
        """Add a commit holding ``files`` (the whole tree), move ``branch`` to it, tag it; return its sha."""
        sha = hashlib.sha1(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in sorted(files.items())})
                           .encode() + str(len(self.commits)).encode()).hexdigest()
        self.commits[sha] = dict(files)
        self.refs[branch] = sha
        for t in tags:
            self.refs[t] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


def file_entry(path: str, data: bytes) -> dict:
    """What the hub reports of one file: size, git oid, and for LFS files the LFS sha256/size/pointer size."""
    if path.endswith(LFS_SUFFIXES):
        pointer = lfs_pointer(data)
        return {"size": len(data), "oid": git_blob_id(pointer),
                "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)}}
    return {"size": len(data), "oid": git_blob_id(data)}


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` (recursively) as {relative posix path: bytes}."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


class HubDouble:
    """The server: ``with HubDouble() as hub: hub.add(repo); hub.url`` (``http://127.0.0.1:<port>``)."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.tokens: set[str] = set()
        self.drop_once: set[str] = set()
        self.fail: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                double._handle(self, head=False)

            def do_HEAD(self):
                double._handle(self, head=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo: Repo) -> Repo:
        self.repos[repo.repo_id] = repo
        return repo

    def downloads(self) -> list[str]:
        """The file paths fetched with GET .../resolve/... so far (in order; a resumed one twice)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.requests
                if m == "GET" and "/resolve/" in p]

    def __enter__(self) -> "HubDouble":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- request handling -------------------------------------------------------------------------------------------

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None,
              head: bool = False) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, str(v))
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _error(self, h, status: int, code: str | None, message: str, head: bool, commit: str | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(h, status, json.dumps({"error": message}).encode(), headers, head)

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        parts = urlsplit(h.path)
        path = unquote(parts.path)
        with self._lock:
            self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
        auth = h.headers.get("Authorization")
        token = auth.split(" ", 1)[1] if auth and auth.lower().startswith("bearer ") else None
        if token is not None and token not in self.tokens:
            return self._error(h, 401, None, "Invalid credentials in Authorization header", head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+)|/tree/([^/]+)(?:/.*)?)?", path)
        if m:
            return self._api(h, m.group(1), m.group(2) or m.group(3) or "main", m.group(3) is not None,
                             parse_qs(parts.query), head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(h, m.group(1), m.group(2), m.group(3), token, head)
        self._error(h, 404, None, "Not Found", head)

    def _repo_or_error(self, h, repo_id: str, revision: str, head: bool):
        repo = self.repos.get(repo_id)
        if repo is None:  # the hub answers 401 for a repository that does not exist (or that the caller cannot see)
            self._error(h, 401, "RepoNotFound", "Repository not found", head)
            return None, None
        sha = repo.resolve(revision)
        if sha is None:
            self._error(h, 404, "RevisionNotFound", "Invalid rev id: " + revision, head)
            return None, None
        return repo, sha

    def _api(self, h, repo_id: str, revision: str, tree: bool, query: dict, head: bool) -> None:
        repo, sha = self._repo_or_error(h, repo_id, revision, head)
        if repo is None:
            return
        files = repo.commits[sha]
        if tree:
            body = [{"type": "file", "path": p, **file_entry(p, d)} for p, d in sorted(files.items())]
        else:
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for p, d in sorted(files.items()):
                e = file_entry(p, d)
                s = {"rfilename": p}
                if blobs:
                    s.update(size=e["size"], blobId=e["oid"])
                    if "lfs" in e:
                        s["lfs"] = {"sha256": e["lfs"]["oid"], "size": e["lfs"]["size"],
                                    "pointerSize": e["lfs"]["pointerSize"]}
                siblings.append(s)
            body = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                    "gated": "manual" if repo.gated else False, "disabled": False, "siblings": siblings}
        self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)

    def _resolve(self, h, repo_id: str, revision: str, file: str, token: str | None, head: bool) -> None:
        repo, sha = self._repo_or_error(h, repo_id, revision, head)
        if repo is None:
            return
        if repo.gated and token not in self.tokens:
            return self._error(h, 403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in "
                               "the authorized list. Visit https://huggingface.co/" + repo_id + " to ask for access.",
                               head)
        data = repo.commits[sha].get(file)
        if data is None or file in self.fail:
            return self._error(h, 404, "EntryNotFound", f"{file} does not exist on \"{revision}\"", head, commit=sha)
        e = file_entry(file, data)
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if "lfs" in e:
            headers.update({"ETag": f'"{e["oid"]}"', "X-Linked-Etag": f'"{e["lfs"]["oid"]}"',
                            "X-Linked-Size": len(data)})
        else:
            headers["ETag"] = f'"{e["oid"]}"'
        start = 0
        rng = h.headers.get("Range")
        if rng and not head:
            m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
            start = int(m.group(1)) if m else 0
        body = data[start:]
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        headers["Content-Length"] = len(body)
        if head:
            return self._send(h, 200, b"", headers, head=True)
        drop = False
        with self._lock:
            if file in self.drop_once:
                self.drop_once.discard(file)
                drop = True
        if not drop:
            return self._send(h, 206 if start else 200, body, headers)
        h.send_response(206 if start else 200)  # the connection breaks half way through the body
        for k, v in headers.items():
            h.send_header(k, str(v))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])
        h.wfile.flush()
        h.close_connection = True
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
