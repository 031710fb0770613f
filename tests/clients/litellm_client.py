"""litellm (in .clients/) against an OpenAI-compatible server through its generic ``openai/`` provider: what it
answers, printed as one JSON line for tests/pipeline/test_openai_clients.py to check. Run with .clients/bin/python:

    LITELLM_LOCAL_MODEL_COST_MAP=True .clients/bin/python tests/clients/litellm_client.py http://127.0.0.1:9000

Nothing here checks anything: chat (``litellm.completion``) and text (``litellm.text_completion``) completions,
each streamed and not, are recorded as they came. Prompts carry Chinese, French accents and emoji.
(LITELLM_LOCAL_MODEL_COST_MAP=True: litellm otherwise fetches its price list from the internet at import.)
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

MESSAGES = [{"role": "user", "content": "Dis « bonjour » en chinois (你好) et ajoute un emoji 👋. Où est le café ?"}]
PROMPT = "Le café de la gare, à Besançon, sert du thé au jasmin 茉莉花茶 🍵 et"


def main(base_url: str, model: str) -> dict:
    common = {"model": f"openai/{model}", "api_base": base_url.rstrip("/") + "/v1", "api_key": "unused",
              "temperature": 0, "num_retries": 0, "timeout": 120}
    out: dict = {}
    t0 = time.monotonic()
    r = litellm.completion(messages=MESSAGES, max_tokens=32, **common)
    out["chat"] = {"content": r.choices[0].message.content, "finish_reason": r.choices[0].finish_reason,
                   "usage": {"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens}}
    pieces, finish, usage = [], None, None
    for chunk in litellm.completion(messages=MESSAGES, max_tokens=32, stream=True,
                                    stream_options={"include_usage": True}, **common):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if getattr(chunk, "usage", None):
            usage = {"prompt_tokens": chunk.usage.prompt_tokens, "completion_tokens": chunk.usage.completion_tokens}
    out["chat_stream"] = {"pieces": pieces, "finish_reason": finish, "usage": usage}

    t = litellm.text_completion(prompt=PROMPT, max_tokens=16, **common)
    out["text"] = {"text": t.choices[0].text, "finish_reason": t.choices[0].finish_reason,
                   "usage": {"prompt_tokens": t.usage.prompt_tokens, "completion_tokens": t.usage.completion_tokens}}
    pieces, finish = [], None
    for chunk in litellm.text_completion(prompt=PROMPT, max_tokens=16, stream=True, **common):
        if chunk.choices:
            c = chunk.choices[0]
            pieces.append(c.get("text") if isinstance(c, dict) else (getattr(c, "text", None) or ""))
            fr = c.get("finish_reason") if isinstance(c, dict) else getattr(c, "finish_reason", None)
            finish = fr or finish
    out["text_stream"] = {"pieces": [p or "" for p in pieces], "finish_reason": finish}
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


if __name__ == "__main__":
    from importlib import metadata

    result = main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m")
    result["versions"] = {"litellm": metadata.version("litellm"), "openai": metadata.version("openai")}
    print(json.dumps(result, ensure_ascii=False))
