"""The OpenAI frontend's API key, body limit and prompt bound, on the real application (FastAPI over httpx's ASGI
transport, the default build's real tokenizer) and the real command: no Triton is needed, every answer here comes
before a request would reach it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import unicodedata

import pytest

from pipeline.openai_frontend import EXIT_REFUSED, FrontendConfig, create_app, main
from pipeline.openai_limits import default_max_body_bytes, longest_token_chars, prompt_char_limit
from pipeline.openai_security import PUBLIC_PATHS, check_bind, is_loopback, BindRefused
from tests.conftest import REPO, smollm2_tokenizer_dir

KEY = "k3y-0f-th1s-test"


@pytest.fixture(scope="module")
def tokenizer_dir():
    return smollm2_tokenizer_dir()


def _app(tokenizer_dir, key=KEY, **cfg):
    cfg = FrontendConfig("127.0.0.1:1", "m", tokenizer_dir, cfg.pop("max_input_len", 64), 128, **cfg)
    return create_app(cfg, api_key=key)


class _Served:
    """``app`` served by uvicorn on 127.0.0.1 (a free port, a thread of this process), asked with http.client."""

    def __init__(self, app):
        import threading

        import uvicorn

        from pipeline.serve import free_ports

        self.port = free_ports(1)[0]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def call(self, method: str, path: str, body=None, headers=None, chunked: bool = False):
        """(status, headers as a lower-case dict, body text)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
        finally:
            conn.close()

    def get(self, path, headers=None):
        return self.call("GET", path, headers=headers)

    def post(self, path, body, headers=None, chunked=False):
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        return self.call("POST", path, data, {"Content-Type": "application/json", **(headers or {})}, chunked)


def _client(app):
    return _Served(app)


# ---- where a key is required ------------------------------------------------------------------------------------

def test_only_loopback_counts_as_loopback():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.1", "192.168.1.2", "no-such-host.invalid"))


def test_a_non_loopback_address_needs_a_key():
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "some-key")
    with pytest.raises(BindRefused) as err:
        check_bind("0.0.0.0", None)
    assert "--host 0.0.0.0" in str(err.value) and "TRTPIPE_API_KEY" in str(err.value)


def _args(port: int, host: str) -> list[str]:
    return ["--grpc-url", "127.0.0.1:1", "--model", "m", "--tokenizer", "/nonexistent", "--max-input-len", "8",
            "--max-seq-len", "16", "--host", host, "--port", str(port)]


def test_the_frontend_refuses_to_start_on_a_public_address_without_a_key_before_it_listens(capsys, monkeypatch):
    """In process: main returns before uvicorn (or the tokenizer, here a folder that does not exist) is touched."""
    monkeypatch.delenv("TRTPIPE_API_KEY", raising=False)
    assert main(_args(9, "0.0.0.0")) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "no API key is set" in err and "Nothing was started" in err


def test_the_frontend_command_refuses_too_and_nothing_listens():
    """The real command, as a deployment runs it: exit status 2, the reason on stderr, the port never bound."""
    from pipeline.serve import free_ports

    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if k != "TRTPIPE_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "pipeline.openai_frontend", *_args(port, "0.0.0.0")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == EXIT_REFUSED, proc.stderr
    assert "error: --host 0.0.0.0" in proc.stderr and "TRTPIPE_API_KEY" in proc.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


# ---- the key on each route --------------------------------------------------------------------------------------

def test_every_route_but_the_probes_needs_the_key(tokenizer_dir):
    with _client(_app(tokenizer_dir)) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": f"Bearer {KEY}x"}, {"Authorization": KEY}):
            status, head, text = c.get("/v1/models", headers=headers)
            assert status == 401, headers
            assert json.loads(text)["error"]["code"] == "invalid_api_key" and head["www-authenticate"] == "Bearer"
            assert KEY not in text
        assert c.post("/v1/chat/completions", {})[0] == 401  # refused before the body is read
        assert c.get("/openapi.json")[0] == 401
        status, _, text = c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert status == 200 and json.loads(text)["data"][0]["id"] == "m"
        assert c.get("/v1/models", headers={"Authorization": f"bearer {KEY}"})[0] == 200
        assert c.get("/metrics")[0] == 200
        assert c.get("/health")[0] == 503  # public: answered (Triton is not there), not 401
    assert PUBLIC_PATHS == ("/health", "/metrics")


def test_without_a_key_nothing_is_asked(tokenizer_dir):
    with _client(_app(tokenizer_dir, key=None)) as c:
        assert c.get("/v1/models")[0] == 200


# ---- body and prompt bounds -------------------------------------------------------------------------------------

AUTH = {"Authorization": f"Bearer {KEY}"}


def test_a_body_over_the_limit_is_refused_from_its_content_length_or_as_it_arrives(tokenizer_dir):
    app = _app(tokenizer_dir, max_body_bytes=1000)
    with _client(app) as c:
        status, _, text = c.post("/v1/completions", b"x" * 1001, AUTH)
        assert status == 413 and json.loads(text)["error"]["code"] == "request_too_large"
        assert "is 1001 bytes" in text and "at most 1000 bytes" in text  # told by its Content-Length
        # no Content-Length: sent chunked, refused once past the limit
        status, _, text = c.post("/v1/completions", iter([b" " * 100] * 20), AUTH, chunked=True)
        assert status == 413 and "is more" in text
        # at the limit the body is read and answered as any other (here: not JSON)
        status, _, text = c.post("/v1/completions", b"x" * 1000, AUTH)
        assert status == 400 and "not JSON" in json.loads(text)["error"]["message"]
        status, _, _ = c.post("/v1/completions", iter([b" " * 100] * 10), AUTH, chunked=True)
        assert status == 400  # 1000 bytes chunked: read whole, then refused as not JSON
    assert default_max_body_bytes(1024) == (1 << 20) + 64 * 1024


class _CountingTokenizer:
    """The real tokenizer, counting its ``encode`` calls (whether a prompt was tokenized)."""

    def __init__(self, tok):
        self._tok, self.encoded = tok, 0

    def encode(self, *a, **k):
        self.encoded += 1
        return self._tok.encode(*a, **k)

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __len__(self):
        return len(self._tok)


def test_a_prompt_longer_than_any_of_max_input_len_tokens_is_refused_untokenized(tokenizer_dir):
    from transformers import AutoTokenizer

    from pipeline.openai_requests import APIError, CompletionBody, prepare

    tok = _CountingTokenizer(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    limit = prompt_char_limit(tok, 64)
    cfg = FrontendConfig("127.0.0.1:1", "m", tokenizer_dir, 64, 128, max_prompt_chars=limit)
    body = CompletionBody(model="m", prompt="x")
    with pytest.raises(APIError) as err:
        prepare(cfg, tok, body, "a" * (limit + 1), False)
    assert err.value.code == "context_length_exceeded" and tok.encoded == 0
    with pytest.raises(APIError) as err:  # at the bound: tokenized, and refused by its token count
        prepare(cfg, tok, body, "a" * limit, False)
    assert err.value.code == "context_length_exceeded" and tok.encoded == 1
    prepare(cfg, tok, body, "Hello there", False)
    assert tok.encoded == 2


def test_a_token_id_prompt_longer_than_max_input_len_is_refused_undecoded(tokenizer_dir):
    with _client(_app(tokenizer_dir, max_input_len=8)) as c:
        status, _, text = c.post("/v1/completions", {"model": "m", "prompt": list(range(100, 109))}, AUTH)
        assert status == 400 and json.loads(text)["error"]["code"] == "context_length_exceeded"
        assert "9 token ids" in json.loads(text)["error"]["message"]


def test_the_character_bound_holds_for_the_default_tokenizer(tokenizer_dir):
    """SmolLM2's byte-level BPE, no normalizer: no token stands for more characters than the longest vocabulary
    entry, on the texts that pack most characters into a token (the longest entries' own text repeated, runs of
    one character, multi-byte text)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    per_token = longest_token_chars(tok)
    vocab = tok.get_vocab()
    assert per_token == max(len(t) for t in vocab)
    longest = sorted(vocab, key=len, reverse=True)[:40]
    texts = [tok.convert_tokens_to_string([t]) * 50 for t in longest]
    texts += [c * 5000 for c in " \n\t=-_*#.a0"] + ["é" * 3000, "日本語" * 2000, "🙂" * 2000, "\u0301" * 3000]
    for text in texts:
        n = len(tok.encode(text, add_special_tokens=False))
        assert n * per_token >= len(text), (text[:20], n, len(text))


def test_nfc_composes_at_most_four_code_points_into_one():
    """NFC_SHRINK: no code point's canonical decomposition is longer than 4 (so NFC folds at most 4 into 1)."""
    from pipeline.openai_limits import NFC_SHRINK

    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000)
                  if not 0xD800 <= c <= 0xDFFF)
    assert longest == NFC_SHRINK


def test_tokenizers_that_lose_characters_get_no_character_bound():
    """A whitespace-dropping pre-tokenizer or WordPiece: any number of characters may make few tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    def fast(model, pre=None, norm=None):
        t = Tokenizer(model)
        t.pre_tokenizer, t.normalizer = pre, norm
        return PreTrainedTokenizerFast(tokenizer_object=t)

    bpe = models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")])
    assert longest_token_chars(fast(bpe)) == 2
    assert longest_token_chars(fast(bpe, pre_tokenizers.Whitespace())) is None
    assert longest_token_chars(fast(bpe, pre_tokenizers.CharDelimiterSplit(" "))) is None
    assert longest_token_chars(fast(bpe, pre_tokenizers.Split(" ", "removed"))) is None
    assert longest_token_chars(fast(bpe, pre_tokenizers.Split(" ", "isolated"))) == 2
    assert longest_token_chars(fast(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))) is None
    assert longest_token_chars(fast(bpe, norm=normalizers.NFC())) == 8
    assert longest_token_chars(fast(bpe, norm=normalizers.Strip())) is None
    assert longest_token_chars(fast(bpe, norm=normalizers.Replace(" ", "\u2581"))) == 2


def test_a_websocket_without_the_key_is_closed_and_lifespan_passes():
    """The middleware itself, given ASGI scopes: no websocket route exists, none passes unchecked."""
    import asyncio

    from pipeline.openai_security import APIKeyAuth

    called, sent = [], []

    async def app(scope, receive, send):
        called.append(scope["type"])

    async def send(message):
        sent.append(message)

    auth = APIKeyAuth(app, KEY)
    asyncio.run(auth({"type": "websocket", "path": "/v1/anything", "headers": []}, None, send))
    assert sent == [{"type": "websocket.close", "code": 1008}] and called == []
    asyncio.run(auth({"type": "websocket", "path": "/v1/anything",
                      "headers": [(b"authorization", f"Bearer {KEY}".encode())]}, None, send))
    asyncio.run(auth({"type": "lifespan"}, None, send))
    assert called == ["websocket", "lifespan"] and len(sent) == 1


def test_the_load_test_client_sends_the_key_from_the_environment(tokenizer_dir, monkeypatch):
    """`trtpipe loadtest --endpoint openai-chat` against a keyed frontend: 401 without $TRTPIPE_API_KEY; with it the
    request gets past the key (and here fails on the missing Triton instead)."""
    import asyncio

    from pipeline.loadtest.metrics import RequestRecord
    from pipeline.loadtest.openai_client import OpenAIConnection

    body = ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                                     "max_tokens": 2})

    async def one() -> RequestRecord:
        conn = OpenAIConnection(f"http://127.0.0.1:{served.port}", chat=True)
        conn.open()
        try:
            return await conn.send(RequestRecord(0, 0.0), body, 30)
        finally:
            await conn.close()

    with _client(_app(tokenizer_dir)) as served:
        monkeypatch.delenv("TRTPIPE_API_KEY", raising=False)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        assert asyncio.run(one()).error.startswith("HTTP 401")
        monkeypatch.setenv("TRTPIPE_API_KEY", KEY)
        rec = asyncio.run(one())
        assert rec.error and "401" not in rec.error and KEY not in rec.error
