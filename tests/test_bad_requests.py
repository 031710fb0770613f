"""Bad input against every model of the repository and the OpenAI frontend (P15 item 3).

One tritonserver for the module, on a repository generated from this checkout's templates (as
tests/model_repo/test_serving_options.py does), and the OpenAI frontend in front of it. Each malformed kind of
tests/bad_input.py's table, sent to each model it applies to, gets an error of its own (within the client
timeout) that names the offending field and is no traceback, and the next good request to that model answers
right. The slow fuzz loop sends seeded random tensors and JSON; afterwards no request hung, no stub restarted and
the server still answers.
"""

from __future__ import annotations

import pytest

from tests import bad_input as bi
from tests.model_repo.test_serving_options import engine_dir  # noqa: F401  (a fixture: the built engine folder)

pytestmark = pytest.mark.e2e

FUZZ_REQUESTS = 84
"""Fuzz requests: 14 rounds over the five models and the OpenAI frontend (a fixed number, not a time budget)."""


@pytest.fixture(scope="module")
def served(engine_dir, tmp_path_factory):  # noqa: F811
    """The module's server and frontend; at the end, no stub restarted and the server stops without force."""
    srv, fe, server = bi.start_served(engine_dir, tmp_path_factory.mktemp("bad-requests"))
    stubs = bi.stub_processes(srv.proc.pid)
    yield srv, server, stubs
    fe.stop(10)
    trouble = bi.stub_trouble(srv.log_path.read_text(errors="replace"))
    restarted = stubs - bi.stub_processes(srv.proc.pid)
    result = srv.stop()
    assert not trouble and not restarted, f"stub trouble: {trouble}, processes gone: {restarted}"
    assert not result["forced"], f"the server needed force to stop: {result}"


@pytest.fixture(scope="module")
def ctx(engine_dir):  # noqa: F811
    return bi.Context.load(engine_dir)


def test_the_table_has_twenty_kinds_and_covers_every_model():
    assert len(bi.KINDS) >= 20 and len(bi.OPENAI_KINDS) >= 10
    assert {m for _, m in bi.cases()} == set(bi.MODELS)


@pytest.mark.parametrize("message, fields, named", [
    ("n = 99: at most 8", ("n",), True),
    ("Internal Server Error", ("n",), False),  # the letter n inside words names nothing
    ("messages.0.role: Input should be 'system' (got 'wizard')", ("role",), True),
    ("messages: Field required", ("messages",), True),
    ("unexpected inference input 'runtime_top_k'", ("top_k",), False),
    ("in ensemble 'ensemble', top_k = -1: must be >= 0", ("top_k",), True),
    ("input 'max_tokens_total' is unknown", ("max_tokens",), False),
    ("unexpected datatype TYPE_FP32 for inference input 'MAX_TOKENS'", ("max_tokens",), True),
    ("inference request batch-size must be <= 8", ("batch-size", "max_batch_size"), True),
    ("the request body is not JSON: Expecting value", ("JSON",), True),
    ("the body is JSONL", ("JSON",), False),
    ("stop = true needs the request_id of the request to stop", ("stop", "request_id"), True),
    ("the stopping criteria are wrong", ("stop",), False),
])
def test_an_error_names_a_field_only_as_a_whole_name(message, fields, named):
    assert bi.names_field(message, fields) is named


@pytest.mark.parametrize("kind,model", bi.cases())
def test_a_malformed_request_gets_its_own_error_naming_the_field(served, ctx, kind, model):
    _, server, _ = served
    for row in bi.run_case(server, ctx, kind, model):
        where = f"{kind} -> {model} over {row['protocol']}: {row['message'][:300]!r}"
        assert not row["hung"], f"no answer within {bi.TIMEOUT_S:.0f} s: {where}"
        assert row["next"], f"the next good request to {model} failed: {row['next_detail']}"
        if row["limit"]:  # Triton answers it itself, without an error (the table says why)
            assert not row["error"] or row["clean"], where
            continue
        assert row["error"], f"answered instead of refused: {where}"
        assert row["field"], f"the error does not name {row['fields']}: {where}"
        assert row["clean"], f"a traceback, not a validation message: {where}"


@pytest.mark.parametrize("kind", list(bi.OPENAI_KINDS))
def test_a_malformed_openai_request_gets_an_openai_error_naming_the_field(served, ctx, kind):
    _, server, _ = served
    row = bi.run_openai_case(server, ctx, kind)
    where = f"{kind}: HTTP {row['status']} {row['message'][:300]!r}"
    assert not row["hung"], where
    assert row["error"], f"not an OpenAI error body with the expected status {bi.OPENAI_KINDS[kind][2]}: {where}"
    assert row["field"], f"error.message does not name {row['fields']}: {where}"
    assert row["next"], f"the next good request failed: {row['next_detail']}"


@pytest.mark.slow
def test_fuzz_leaves_the_server_serving_with_no_stub_restarted(served, ctx):
    srv, server, stubs = served
    report = bi.fuzz(server, seed=15, vocab=ctx.vocab, requests=FUZZ_REQUESTS)
    summary = report.summary()
    print(f"fuzz: {summary['requests']} requests in {summary['seconds']} s, {summary['errors']} errors, by kind:",
          *(f"  {k}: {v}" for k, v in summary["by_kind"].items()), sep="\n")
    assert summary["requests"] == FUZZ_REQUESTS >= 50 and set(summary["by_model"]) == set(bi.MODELS) | {"openai"}
    assert not summary["hung"], summary["hung"]
    assert not summary["tracebacks"], summary["tracebacks"]
    assert bi.stub_processes(srv.proc.pid) == stubs, "a stub or the engine worker was restarted"
    assert not bi.stub_trouble(srv.log_path.read_text(errors="replace"))
    for model in bi.MODELS:
        reply = bi.send(server, model, ctx.good(model), bi.protocols(model)[0])
        assert reply.error is None and ctx.answered(model, reply.outputs) is None, (model, reply.error)
    assert bi.good_completion(server, ctx) is None
