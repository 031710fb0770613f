"""LangChain's ChatOpenAI (langchain-openai, in .clients/) against an OpenAI-compatible server: what it answers,
printed as one JSON line for tests/pipeline/test_openai_clients.py to check. Run with .clients/bin/python:

    .clients/bin/python tests/clients/langchain_client.py http://127.0.0.1:9000 smollm2-135m

Nothing here checks anything: it only drives the client the way an application would (invoke, stream, structured
output as a Pydantic model by both of LangChain's methods, tools bound with tool_choice "required", streamed too)
and records what came back. Prompts carry Chinese, French accents and emoji.
"""

from __future__ import annotations

import json
import sys
import time

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

PROMPT = "Dis-moi en une phrase : où se trouve le café « Les Deux Magots » ? 用中文也说一遍，再加一个表情 🎉。"
TOOL_PROMPT = "Quel temps fait-il à Zürich ? 北京的天气怎么样？🌦"
STRUCTURED_PROMPT = "Give the capital of France and its country as JSON. Réponds en français, s'il te plaît ✨"


class City(BaseModel):
    """A city and the country it is the capital of."""

    name: str = Field(description="the city's name, e.g. Paris or 北京")
    country: str = Field(description="the country's name")


@tool
def get_weather(city: str) -> str:
    """The current weather in a city (e.g. 北京, Zürich, São Paulo)."""
    return "ensoleillé ☀️"


def _calls(message) -> list[dict]:
    return [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]


def main(base_url: str, model: str) -> dict:
    llm = ChatOpenAI(model=model, base_url=base_url.rstrip("/") + "/v1", api_key="unused", temperature=0,
                     max_tokens=48, max_retries=0, timeout=120)
    out: dict = {}
    t0 = time.monotonic()
    r = llm.invoke(PROMPT)
    out["invoke"] = {"content": r.content, "finish_reason": r.response_metadata.get("finish_reason"),
                     "usage": dict(r.usage_metadata or {})}
    chunks = list(llm.stream(PROMPT))
    out["stream"] = {"n_chunks": len(chunks), "pieces": [c.content for c in chunks],
                     "finish_reason": next((c.response_metadata.get("finish_reason") for c in chunks
                                            if c.response_metadata.get("finish_reason")), None)}

    structured = ChatOpenAI(model=model, base_url=base_url.rstrip("/") + "/v1", api_key="unused", temperature=0,
                            max_tokens=96, max_retries=0, timeout=120)
    out["structured"] = {}
    for method in ("json_schema", "function_calling"):
        try:
            city = structured.with_structured_output(City, method=method).invoke(STRUCTURED_PROMPT)
            out["structured"][method] = {"type": type(city).__name__,
                                         "value": city.model_dump() if isinstance(city, BaseModel) else city}
        except Exception as e:  # recorded, for the test to report
            out["structured"][method] = {"error": f"{type(e).__name__}: {e}"}

    bound = structured.bind_tools([get_weather], tool_choice="required")
    m = bound.invoke(TOOL_PROMPT)
    out["tools"] = {"calls": _calls(m), "finish_reason": m.response_metadata.get("finish_reason"),
                    "content": m.content}
    pieces = list(bound.stream(TOOL_PROMPT))
    whole = pieces[0]
    for p in pieces[1:]:
        whole = whole + p
    out["tools_stream"] = {"calls": _calls(whole), "n_chunks": len(pieces),
                           "finish_reason": whole.response_metadata.get("finish_reason")}
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


if __name__ == "__main__":
    import langchain_core
    import langchain_openai
    import openai

    result = main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m")
    result["versions"] = {"langchain-openai": langchain_openai.__version__ if hasattr(langchain_openai, "__version__")
                          else None, "langchain-core": langchain_core.__version__, "openai": openai.__version__}
    print(json.dumps(result, ensure_ascii=False))
