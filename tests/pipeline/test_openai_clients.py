"""Client libraries no one here wrote, against the OpenAI frontend serving the default build: LangChain's ChatOpenAI,
litellm and NVIDIA AIPerf, with Chinese, French accents and emoji, streamed and not, a few requests each.

They live in their own venvs (scripts/setup.sh; pins in tests/clients/*.txt): ``.clients/`` (langchain-openai,
litellm) and ``.aiperf/`` (aiperf), and run as their own processes: tests/clients/langchain_client.py and
litellm_client.py drive their library as an application would and print what came back; the checks are here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

CLIENTS = REPO / ".clients" / "bin" / "python"
AIPERF = REPO / ".aiperf" / "bin" / "aiperf"
MODEL = "smollm2-135m"


def _clean(text: str) -> bool:
    """Whole characters only: no U+FFFD (a character whose UTF-8 bytes were split between tokens or chunks)."""
    return isinstance(text, str) and "\ufffd" not in text


def _drive(script: str, url: str) -> dict:
    assert CLIENTS.is_file(), f"{CLIENTS} is missing: run `bash scripts/setup.sh --tools` (it creates .clients/)"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([str(CLIENTS), str(REPO / "tests" / "clients" / script), url, MODEL], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{script} exited {p.returncode}:\n{(p.stdout + p.stderr)[-4000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def langchain(frontend):
    return _drive("langchain_client.py", frontend.launch.url)


@pytest.fixture(scope="module")
def litellm(frontend):
    return _drive("litellm_client.py", frontend.launch.url)


def test_langchain_invoke_and_stream_give_one_answer(langchain):
    one, streamed = langchain["invoke"], langchain["stream"]
    assert one["content"] and _clean(one["content"]) and one["finish_reason"] in ("stop", "length")
    assert one["usage"]["input_tokens"] > 0 and 0 < one["usage"]["output_tokens"] <= 48
    assert one["usage"]["total_tokens"] == one["usage"]["input_tokens"] + one["usage"]["output_tokens"]
    assert streamed["n_chunks"] > 2 and all(_clean(p) for p in streamed["pieces"])
    assert "".join(streamed["pieces"]) == one["content"]  # greedy: the same answer, whole characters per chunk
    assert streamed["finish_reason"] == one["finish_reason"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output_parses_into_the_pydantic_model(langchain, method):
    got = langchain["structured"][method]
    assert "error" not in got, got
    assert got["type"] == "City" and set(got["value"]) == {"name", "country"}
    assert all(isinstance(v, str) and _clean(v) for v in got["value"].values())


def test_langchain_bound_tools_with_required_choice_call_the_tool(langchain):
    one, streamed = langchain["tools"], langchain["tools_stream"]
    assert one["finish_reason"] == "tool_calls" and len(one["calls"]) >= 1
    assert all(c["name"] == "get_weather" and isinstance(c["args"].get("city"), str) and _clean(c["args"]["city"])
               for c in one["calls"])
    assert streamed["calls"] == one["calls"] and streamed["finish_reason"] == "tool_calls"


def test_litellm_chat_streamed_and_not(litellm):
    one, streamed = litellm["chat"], litellm["chat_stream"]
    assert one["content"] and _clean(one["content"]) and not one["content"].isascii()
    assert one["finish_reason"] in ("stop", "length") and streamed["finish_reason"] == one["finish_reason"]
    assert all(_clean(p) for p in streamed["pieces"]) and "".join(streamed["pieces"]) == one["content"]
    assert one["usage"]["prompt_tokens"] > 0 and 0 < one["usage"]["completion_tokens"] <= 32
    assert streamed["usage"] == one["usage"]  # stream_options.include_usage


def test_litellm_text_completion_streamed_and_not(litellm):
    one, streamed = litellm["text"], litellm["text_stream"]
    assert one["text"] and _clean(one["text"]) and one["finish_reason"] in ("stop", "length")
    assert "".join(streamed["pieces"]) == one["text"] and streamed["finish_reason"] == one["finish_reason"]
    assert one["usage"]["prompt_tokens"] > 0 and 0 < one["usage"]["completion_tokens"] <= 16


PROMPTS = ["What is the capital of France?", "中国的首都是哪座城市？", "Écris une phrase sur le café et la crème brûlée.",
           "Reply with three emoji: 🎉🐱🚀"]


@pytest.mark.parametrize("endpoint,streaming", [("chat", True), ("completions", False)])
def test_aiperf_profile_completes_every_request(frontend, built_default, tmp_path, endpoint, streaming):
    """A tiny AIPerf profile (4 requests, concurrency 1, 16 output tokens each) over non-ASCII prompts: every request
    completes without error and the token counts it reports are the server's ``usage``, equal to its own
    tokenizer's count of the answers (``osl_mismatch_count`` 0). Greedy, with vLLM's ``ignore_eos`` (the usual
    benchmark setting, through ``--extra-inputs``): every answer has its 16 tokens (without it, SmolLM2 ends the
    plain completion of "What is the capital of France?" at once, an empty answer aiperf counts as an error), and
    whole characters."""
    assert AIPERF.is_file(), f"{AIPERF} is missing: run `bash scripts/setup.sh --tools` (it creates .aiperf/)"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in PROMPTS), encoding="utf-8")
    out = tmp_path / "aiperf"
    cmd = [str(AIPERF), "profile", "-m", MODEL, "--url", frontend.launch.url, "--endpoint-type", endpoint,
           *(["--streaming"] if streaming else []), "--tokenizer", str(built_default / "engine"),
           "--input-file", str(prompts), "--custom-dataset-type", "single_turn", "--request-count", str(len(PROMPTS)),
           "--concurrency", "1", "--prompt-output-tokens-mean", "16", "--use-server-token-count",
           "--extra-inputs", "temperature:0", "--extra-inputs", "ignore_eos:true",
           "--output-artifact-dir", str(out), "--ui-type", "simple", "--no-auto-plot", "--export-outputs-json"]
    # aiperf 0.13.0 cannot load a tokenizer from a local folder when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set
    # (any value): it asks huggingface_hub's snapshot_download for the path as a repo id. A local path never
    # reaches the hub without them (its alias lookup skips paths).
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"aiperf exited {p.returncode}:\n{(p.stdout + p.stderr)[-4000:]}"
    report = json.loads((out / "profile_export_aiperf.json").read_text())
    assert report["is_complete"] and not report["was_cancelled"] and report["error_summary"] == []
    assert report["request_count"]["avg"] == report["completed_request_count"]["avg"] == len(PROMPTS)
    assert report["request_error_rate"]["avg"] == 0
    assert report["osl_mismatch_count"]["avg"] == 0
    assert report["usage_completion_tokens"]["min"] == report["usage_completion_tokens"]["max"] == 16
    assert report["usage_prompt_tokens"]["min"] > 0
    if streaming:
        assert report["time_to_first_token"]["count"] == len(PROMPTS)
    sent = json.loads((out / "inputs.json").read_text(encoding="utf-8"))
    texts = [json.dumps(s["payloads"][0], ensure_ascii=False) for s in sent["data"]]
    assert all(any(t in x for x in texts) for t in PROMPTS)  # the non-ASCII prompts went out as written
    answers = [r["response_text"] for r in json.loads((out / "outputs.json").read_text(encoding="utf-8"))["data"]]
    assert len(answers) == len(PROMPTS) and all(a and _clean(a) for a in answers), answers
