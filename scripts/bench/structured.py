"""Structured output on the portable runtime: what a JSON constraint costs, what compiling grammars costs, and how
often the answers are valid JSON.

Three parts, on the default build (build/smollm2-135m/cpu: SmolLM2-135M INT4-AWQ, dequantized, `pytorch` runtime):

(a) Cost per token. Served: `trtpipe loadtest` on the Triton ensemble, the same chat-formatted person prompts
    with and without a JSON-schema constraint (`--response-format json_schema:...` vs its `--check-only`
    baseline: same prompts, same client work), greedy, fixed max_tokens, closed loop at each concurrency: TPOT,
    ITL, output throughput and the share of answers that validate. Two schemas: the person schema as is, and the
    same with ``maxLength`` on its strings (xgrammar's mask inside a bounded string is far slower). In-process:
    the time per token of what the runtime's GrammarProcessor does for one sequence (trtpipe_runtime.grammar:
    ``Matcher.mask_``, i.e. xgrammar's ``fill_next_token_bitmask`` plus the unpack and ``masked_fill_`` on a
    vocabulary-wide float32 row, and ``Matcher.advance``), over the real tokenizer's tokens of a valid answer.
(b) Compiling. In-process with ``trtpipe_runtime.grammar.Grammars`` (the runtime's own cache): the compiler's
    one-time tokenizer set-up, each schema's first compile (median of ``--compile-reps``; xgrammar's own cache is
    off, as in the runtime) and a cached lookup, for schemas of growing size; then a workload of ``--requests``
    requests that draw schemas from ``--variants`` distinct ones (Zipf, seeded): the cache's hit rate and the
    compile seconds saved. Served: time to first token of a request with a never-seen schema vs the same schema
    again, and the first guided request after the server started (the compiler's set-up).
(c) Valid JSON. ``--prompts`` free-form prompts (8 languages or styles, incl. Chinese, French, Japanese and emoji;
    generated deterministically, each asking for JSON in its own language) through the OpenAI frontend's
    /v1/chat/completions, with ``response_format: json_object`` and without it (the prompt alone asks for JSON):
    the share that parses as a JSON object, failures by cause (pipeline.structured.CAUSES; answers cut by
    max_tokens also counted when their tail repeats itself, the small model's loop).

Prints markdown tables; ``--json`` keeps every number. About 9-10 minutes on 2 CPU cores.

    make build-engine
    .venv/bin/python scripts/bench/structured.py --json docs/benchmarks/structured.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

import numpy as np  # noqa: E402

from pipeline.loadtest.api import run_loadtest  # noqa: E402
from pipeline.loadtest.config import LoadTestConfig  # noqa: E402
from pipeline.loadtest.selfcheck import serve_repository  # noqa: E402

# ---- schemas ---------------------------------------------------------------------------------------------------

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string"},
    "languages": {"type": "array", "items": {"enum": ["English", "中文", "Français", "Español"]}, "maxItems": 3}},
    "required": ["name", "age", "city", "languages"], "additionalProperties": False}


def bounded(schema, n: int = 24):
    """``schema`` with ``maxLength`` ``n`` on every string that is not an enum (recursively)."""
    if isinstance(schema, list):
        return [bounded(x, n) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v, n) for k, v in schema.items()}
    if out.get("type") == "string" and "enum" not in out:
        out["maxLength"] = n
    return out


ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
ORDER = {"type": "object", "properties": {
    "order_id": {"type": "string"}, "created": {"type": "string", "format": "date-time"},
    "customer": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                                                  "vip": {"type": "boolean"}}, "required": ["name", "email"]},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
        "required": ["sku", "qty", "price"]}},
    "status": {"enum": ["new", "paid", "shipped", "cancelled"]}, "total": {"type": "number"},
    "notes": {"type": ["string", "null"]}},
    "required": ["order_id", "customer", "items", "status", "total"]}


def wide(n: int) -> dict:
    """An object schema of ``n`` required properties of mixed types, every fifth a nested object of three."""
    kinds = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
             {"type": "array", "items": {"type": "string"}, "maxItems": 4}]
    props = {}
    for i in range(n):
        props[f"field_{i}"] = kinds[i % 5] if i % 5 != 4 else {
            "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                                             "c": {"enum": ["x", "y", "z"]}}, "required": ["a", "b", "c"]}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


SCHEMAS = {"answer (1 property)": ANSWER, "person (4)": PERSON, "person, maxLength 24": bounded(PERSON),
           "order (nested, 14)": ORDER, "wide-50": wide(50), "wide-200": wide(200)}

INSTANCES = {"answer (1 property)": {"answer": "The capital of France is Paris."},
             "person (4)": {"name": "Marie Curie", "age": 66, "city": "Paris", "languages": ["Français", "English"]},
             "person, maxLength 24": {"name": "Marie Curie", "age": 66, "city": "Paris",
                                      "languages": ["Français", "English"]},
             "order (nested, 14)": {"order_id": "A-1001", "customer": {"name": "Li Wei", "email": "li@example.com"},
                                    "items": [{"sku": "X1", "qty": 2, "price": 9.5}], "status": "paid",
                                    "total": 19.0}}
"""A valid answer per schema (properties in schema order, as xgrammar writes them), tokenized for the mask timing."""

# ---- prompts ---------------------------------------------------------------------------------------------------

PROMPT_SETS = {
    "en": ("Answer in JSON.", ["Describe {t}.", "List three facts about {t}.", "What is special about {t}?",
                               "Give me a short profile of {t}.", "Summarize what you know about {t}."],
           ["the city of Paris", "a golden retriever", "the planet Jupiter", "the Python programming language",
            "a chocolate cake recipe"]),
    "fr": ("Réponds en JSON.", ["Décris {t}.", "Donne trois faits sur {t}.", "Qu'est-ce qui rend {t} unique ?",
                                "Présente {t} en quelques mots.", "Résume ce que tu sais sur {t}."],
           ["la tour Eiffel", "un chat persan", "la ville de Lyon", "le fromage de Comté", "la Révolution française"]),
    "zh": ("请用JSON回答。", ["请介绍一下{t}。", "列出关于{t}的三个事实。", "{t}有什么特别之处？", "用几句话描述{t}。",
                         "总结一下你对{t}的了解。"],
           ["长城", "北京", "熊猫", "中国茶", "春节"]),
    "es": ("Responde en JSON.", ["Describe {t}.", "Dime tres datos sobre {t}.", "¿Qué tiene de especial {t}?",
                                 "Haz un perfil breve de {t}.", "Resume lo que sabes de {t}."],
           ["la ciudad de Madrid", "la paella", "el río Amazonas", "un perro pastor", "el flamenco"]),
    "de": ("Antworte in JSON.", ["Beschreibe {t}.", "Nenne drei Fakten über {t}.", "Was ist besonders an {t}?",
                                 "Gib ein kurzes Profil von {t}.", "Fasse zusammen, was du über {t} weißt."],
           ["den Schwarzwald", "die Stadt Berlin", "einen Apfelstrudel", "den Rhein", "ein Fahrrad"]),
    "ja": ("JSONで答えてください。", ["{t}について説明してください。", "{t}について三つの事実を挙げてください。",
                               "{t}の特徴は何ですか？", "{t}を短く紹介してください。", "{t}について知っていることをまとめてください。"],
           ["富士山", "東京", "寿司", "桜", "新幹線"]),
    "emoji": ("Answer in JSON 🙏", ["Tell me about {t} 😀", "3 facts about {t} 🤔", "Why do people love {t}? ❤️",
                                   "Rate {t} from 1 to 10 ⭐", "Describe {t} in emoji-friendly words 🎉"],
              ["pizza 🍕", "the ocean 🌊", "rockets 🚀", "cats 🐱", "soccer ⚽"]),
    "mixed": ("Output JSON only.", ["Convert this to a record: {t}", "Extract the entities from: {t}",
                                    "Classify the sentiment of: {t}", "Give the key and value pairs in: {t}",
                                    "Parse: {t}"],
              ["'Alice, 34, lives in Toronto'", "'Le 14 juillet 1789, Paris'", "'我喜欢喝咖啡 ☕ every morning'",
               "'price=12.50 EUR; qty=3'", "'Meeting on Monday at 10:00 with Bob'"]),
}


def free_form_prompts(n: int) -> list[dict]:
    """``n`` prompts (languages x templates x topics, interleaved by language, deterministic), each ending with
    its language's request for JSON; ``{"prompt", "lang"}``."""
    per = []
    for lang, (ask, templates, topics) in PROMPT_SETS.items():
        rows = [f"{tpl.format(t=top)} {ask}" for top in topics for tpl in templates]
        per.append([(lang, r) for r in rows])
    out = [x for group in zip(*per) for x in group]
    return [{"prompt": p, "lang": lang} for lang, p in out[:n]]


PERSON_PROMPTS = ["Describe a person who lives in Paris.", "请描述一位住在北京的人。", "Décris une personne qui vit à Lyon.",
                  "Describe a software engineer from Berlin.", "Invent a character for a novel set in Tokyo.",
                  "Describe your best friend.", "Describe a teacher from Madrid.", "Describe a chef who loves pizza 🍕."]


# ---- in-process ------------------------------------------------------------------------------------------------


def engine_info(engine: Path) -> tuple[int, list[int]]:
    cfg = json.loads((engine / "config.json").read_text())
    eos = json.loads((engine / "generation_config.json").read_text()).get("eos_token_id")
    return int(cfg["vocab_size"]), (eos if isinstance(eos, list) else [eos])


def compile_phase(engine: Path, reps: int, requests: int, variants: int, seed: int) -> dict:
    """(b) in-process: the compiler's set-up, first compile vs cached lookup per schema, and the cache's hit rate
    over a workload that repeats schemas."""
    from trtpipe_runtime.grammar import Grammars, Guide

    import transformers  # noqa: F401  (imports are not part of the set-up: a server has them already)
    import xgrammar  # noqa: F401

    vocab, eos = engine_info(engine)
    g = Grammars(str(engine), vocab, eos)
    t = time.perf_counter()
    g._get_compiler()  # what the first guided request after a start pays (tokenizer + TokenizerInfo)
    setup = time.perf_counter() - t
    g.compiled(Guide("json_schema", json.dumps({"type": "object", "title": "warm-up"})))  # xgrammar's own first use
    rows = []
    guides = {name: Guide("json_schema", json.dumps(s, ensure_ascii=False)) for name, s in SCHEMAS.items()}
    guides["json_object (built in)"] = Guide("json", "")
    guides["regex: ISO date"] = Guide("regex", r"\d{4}-\d{2}-\d{2}")
    for name, guide in guides.items():
        firsts = []
        for _ in range(reps):
            g._cache.pop((guide.kind, guide.text), None)
            t = time.perf_counter()
            g.compiled(guide)
            firsts.append(time.perf_counter() - t)
        hits = []
        for _ in range(100):
            t = time.perf_counter()
            g.compiled(guide)
            hits.append(time.perf_counter() - t)
        rows.append({"schema": name, "guide_bytes": len(guide.text.encode()), "first_compile_s": statistics.median(firsts),
                     "first_compile_all_s": firsts, "cached_s": statistics.median(hits)})
        print(f"compile {name}: {rows[-1]['first_compile_s'] * 1e3:.1f} ms first, "
              f"{rows[-1]['cached_s'] * 1e6:.1f} us cached", flush=True)
    # The workload: `requests` requests, each naming one of `variants` distinct schemas (persons and orders with a
    # per-variant title, so each is its own cache entry), drawn Zipf-like (weight 1/rank).
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, variants + 1)
    draws = rng.choice(variants, size=requests, p=weights / weights.sum())
    wl = Grammars(str(engine), vocab, eos)
    wl._compiler = g._compiler  # the same compiler: the set-up is counted above, not here
    per_compile = {}
    for v in draws:
        base = PERSON if v % 2 == 0 else ORDER
        guide = Guide("json_schema", json.dumps({**base, "title": f"variant-{v}"}))
        before = wl.stats.compile_seconds
        wl.compiled(guide)
        if wl.stats.compile_seconds > before:
            per_compile[int(v)] = wl.stats.compile_seconds - before
    no_cache_s = sum(per_compile[int(v)] for v in draws)  # every request compiling its schema again
    workload = {"requests": requests, "distinct_schemas": variants, "distinct_drawn": len(per_compile),
                "draw": "Zipf (weight 1/rank), seed " + str(seed), "compiles": wl.stats.compiles,
                "hits": wl.stats.hits, "hit_rate": wl.stats.hit_rate, "compile_seconds": wl.stats.compile_seconds,
                "compile_seconds_without_cache": no_cache_s}
    print(f"cache: {wl.stats.hits}/{requests} hits ({wl.stats.hit_rate:.1%}), {wl.stats.compile_seconds:.2f} s "
          f"compiling vs {no_cache_s:.2f} s without the cache", flush=True)
    return {"compiler_setup_s": setup, "schemas": rows, "workload": workload}, g


def mask_phase(engine: Path, g) -> list[dict]:
    """(a) in-process: per token of a valid answer, the time of Matcher.mask_ (and of xgrammar's
    fill_next_token_bitmask alone) and Matcher.advance, on a vocabulary-wide float32 row."""
    import torch
    from transformers import AutoTokenizer

    from trtpipe_runtime.grammar import Guide

    vocab, eos = engine_info(engine)
    tok = AutoTokenizer.from_pretrained(str(engine))
    torch.set_num_threads(1)  # the runtime's stub shares 2 cores with the server; a mask is a per-row Python loop
    rows = []
    cases = [(name, Guide("json_schema", json.dumps(SCHEMAS[name], ensure_ascii=False)), INSTANCES[name])
             for name in INSTANCES]
    cases.append(("json_object (built in)", Guide("json", ""), INSTANCES["order (nested, 14)"]))
    for name, guide, instance in cases:
        ids = tok.encode(json.dumps(instance, ensure_ascii=False), add_special_tokens=False) + [eos[0]]
        m = g.matcher(guide, eos)
        row = torch.zeros(vocab)
        masks, fills, advances = [], [], []
        for k in range(len(ids)):
            r = row.clone()
            t = time.perf_counter()
            m.mask_(r)
            masks.append(time.perf_counter() - t)
            if not m._m.is_terminated():
                t = time.perf_counter()
                m._m.fill_next_token_bitmask(m._bitmask)
                fills.append(time.perf_counter() - t)
            t = time.perf_counter()
            m.advance(ids[:k + 1])
            advances.append(time.perf_counter() - t)
        in_string = _string_positions(tok, ids)
        rows.append({"schema": name, "tokens": len(ids), "accepted": not m.broken,
                     "mask_ms_mean": 1e3 * statistics.mean(masks), "mask_ms_median": 1e3 * statistics.median(masks),
                     "mask_ms_max": 1e3 * max(masks),
                     "mask_ms_mean_inside_strings": 1e3 * statistics.mean([x for x, s in zip(masks, in_string) if s])
                     if any(in_string) else None,
                     "mask_ms_mean_outside_strings": 1e3 * statistics.mean([x for x, s in zip(masks, in_string)
                                                                           if not s]),
                     "fill_bitmask_ms_mean": 1e3 * statistics.mean(fills),
                     "advance_ms_mean": 1e3 * statistics.mean(advances), "mask_ms": [1e3 * x for x in masks]})
        print(f"mask {name}: {rows[-1]['mask_ms_mean']:.2f} ms/token mean ({rows[-1]['mask_ms_median']:.2f} median, "
              f"max {rows[-1]['mask_ms_max']:.1f}), advance {rows[-1]['advance_ms_mean'] * 1e3:.0f} us, "
              f"{'accepted' if not m.broken else 'REFUSED'}", flush=True)
    return rows


def _string_positions(tok, ids: list[int]) -> list[bool]:
    """For each position k: is the grammar inside a JSON string when the k-th token is chosen (an odd number of
    unescaped quotes in the text before it)?"""
    out = []
    for k in range(len(ids)):
        text = tok.decode(ids[:k])
        out.append(len(re.findall(r'(?<!\\)"', text)) % 2 == 1)
    return out


# ---- served ----------------------------------------------------------------------------------------------------


def served_compile(grpc: str, schemas: list[str]) -> dict:
    """TTFT of guided requests (max_tokens 1) through the ensemble: the first after the start (the compiler's
    set-up + compile), then per schema a never-seen variant (compile) and the same again (cache hit)."""
    from pipeline.client import stream_generate

    def ttft(guide_type: str, guide: str) -> float:
        t0 = time.perf_counter()
        for chunk in stream_generate(grpc, "Hi", 1, extra={"guided_decoding_guide_type": guide_type,
                                                           "guided_decoding_guide": guide}):
            if chunk.num_tokens:
                return chunk.t - t0
        return float("nan")

    plain = []
    for _ in range(3):
        t0 = time.perf_counter()
        for chunk in stream_generate(grpc, "Hi", 1):
            if chunk.num_tokens:
                plain.append(chunk.t - t0)
                break
    first = ttft("regex", "(yes|no)")
    rows = []
    for name in schemas:
        fresh = json.dumps({**SCHEMAS[name], "title": f"fresh-{time.time_ns()}"}, ensure_ascii=False)
        new, again = ttft("json_schema", fresh), ttft("json_schema", fresh)
        rows.append({"schema": name, "ttft_new_schema_s": new, "ttft_same_schema_again_s": again})
        print(f"served TTFT {name}: new schema {new * 1e3:.0f} ms, again {again * 1e3:.0f} ms", flush=True)
    return {"ttft_unguided_s": statistics.median(plain), "ttft_first_guided_after_start_s": first, "rows": rows}


def person_dataset(path: Path, engine: Path) -> Path:
    """The person prompts with the chat template applied (the Triton endpoint sends text as is)."""
    from pipeline.client import format_chat

    with open(path, "w") as fh:
        for p in PERSON_PROMPTS:
            fh.write(json.dumps({"prompt": format_chat(engine, p + " Answer in JSON with name, age, city and "
                                                              "languages.")}, ensure_ascii=False) + "\n")
    return path


def _row(rep: dict, **label) -> dict:
    p = rep["points"][0]
    s = p["summary"]
    st = s.get("structured") or {}
    return {**label, "requests": s["requests"]["completed"], "failed": s["requests"]["failed"],
            "tpot_p50_s": s["tpot_s"]["p50"], "tpot_mean_s": s["tpot_s"]["mean"], "itl_p50_s": s["itl_s_pooled"]["p50"],
            "ttft_p50_s": s["ttft_s"]["p50"], "output_token_throughput": s["output_token_throughput"],
            "output_tokens_mean": s["output_tokens_per_request"]["mean"], "valid": st.get("valid"),
            "checked": st.get("checked"), "failures_by_cause": st.get("failures_by_cause"),
            "point_valid": p["validity"]["valid"], "validity_reasons": p["validity"]["reasons"]}


def cost_phase(grpc: str, metrics: str, engine: Path, tmp: Path, concurrencies: list[int], max_tokens: int,
               per_point: int) -> list[dict]:
    """(a) served: the same prompts without and with each JSON-schema constraint, at each concurrency."""
    data = person_dataset(tmp / "persons.jsonl", engine)
    arms = {"none": (PERSON, True), "person schema": (PERSON, False),
            "person schema, maxLength 24": (bounded(PERSON), False)}
    files = {}
    for name, (schema, _) in arms.items():
        files[name] = tmp / f"{re.sub(r'[^a-z0-9]+', '_', name)}.json"
        files[name].write_text(json.dumps(schema, ensure_ascii=False))
    rows = []
    for c in concurrencies:
        for name, (schema, check_only) in arms.items():
            cfg = LoadTestConfig(url=grpc, metrics_url=metrics, mode="closed", concurrency=[c],
                                 num_requests=per_point * c, warmup=c, output_len=str(max_tokens), dataset=data,
                                 tokenizer_dir=engine, seed=0, response_format=f"json_schema:{files[name]}",
                                 check_only=check_only)
            t = time.perf_counter()
            row = _row(run_loadtest(cfg), concurrency=c, constraint=name)
            row["wall_s"] = time.perf_counter() - t
            rows.append(row)
            print(f"c={c} {name}: TPOT p50 {row['tpot_p50_s'] * 1e3:.1f} ms, {row['output_token_throughput']:.1f} "
                  f"tok/s, {row['valid']}/{row['checked']} valid ({row['wall_s']:.0f} s)", flush=True)
    return rows


def _loops(text: str) -> bool:
    """The text ends in a loop: periodic with some period of 1-40 characters over its last max(3 x period, 30)
    characters (a cut answer may end inside the repeated unit)."""
    t = text.rstrip()
    for period in range(1, 41):
        w = max(3 * period, 30)
        if len(t) >= w + period and all(t[i] == t[i - period] for i in range(len(t) - w, len(t))):
            return True
    return False


def validity_phase(openai_url: str, engine: Path, tmp: Path, n: int, concurrency: int, max_tokens: int,
                   arms: tuple = ("constrained", "free")) -> list[dict]:
    """(c) the free-form prompts through the OpenAI frontend, with (``constrained``) and without (``free``)
    response_format json_object."""
    prompts = free_form_prompts(n)
    data = tmp / "free_form.jsonl"
    data.write_text("".join(json.dumps({"prompt": p["prompt"]}, ensure_ascii=False) + "\n" for p in prompts))
    lang = {p["prompt"]: p["lang"] for p in prompts}
    rows = []
    for name, check_only in (("response_format json_object", False), ("none (the prompt asks for JSON)", True)):
        if ("free" if check_only else "constrained") not in arms:
            continue
        cfg = LoadTestConfig(url=openai_url, endpoint="openai-chat", mode="closed", concurrency=[concurrency],
                             num_requests=n, warmup=0, output_len=str(max_tokens), dataset=data,
                             tokenizer_dir=engine, seed=0, response_format="json_object", check_only=check_only)
        t = time.perf_counter()
        rep = run_loadtest(cfg)
        row = _row(rep, constraint=name, concurrency=concurrency)
        row["wall_s"] = time.perf_counter() - t
        reqs = [r for r in rep["points"][0]["requests"] if not r["warmup"] and r["check"] is not None]
        specs = {r["index"]: r for r in reqs}
        cut = [r for r in reqs if r["check"]["cause"] == "cut_by_max_tokens"]
        row["cut_and_looping"] = sum(1 for r in cut if _loops(r["text"] or ""))
        by_lang: dict = {}
        texts = [json.loads(x)["prompt"] for x in data.read_text().splitlines()]
        order = np.random.default_rng(0).permutation(len(texts))  # from_jsonl's shuffle (seed 0, point 0)
        for r in reqs:
            lg = lang[texts[order[r["index"] % len(texts)]]]
            d = by_lang.setdefault(lg, {"checked": 0, "valid": 0})
            d["checked"] += 1
            d["valid"] += bool(r["check"]["valid"])
        row["by_language"] = by_lang
        row["examples"] = {cause: next((specs[i]["text"][:160] for i in specs if specs[i]["check"]["cause"] == cause),
                                       None) for cause in (row["failures_by_cause"] or {})}
        rows.append(row)
        print(f"{name}: {row['valid']}/{row['checked']} valid JSON objects, failures {row['failures_by_cause']} "
              f"(cut and looping: {row['cut_and_looping']}) ({row['wall_s']:.0f} s)", flush=True)
    return rows


# ---- tables ----------------------------------------------------------------------------------------------------


def tables(res: dict) -> str:
    out = []
    c = res["compile"]
    out.append(f"\n(b) compiler set-up (once per server, first guided request): {c['compiler_setup_s']:.2f} s\n")
    out.append("| schema | guide bytes | first compile ms | cached lookup us |")
    out.append("|---|---|---|---|")
    for r in c["schemas"]:
        out.append(f"| {r['schema']} | {r['guide_bytes']} | {r['first_compile_s'] * 1e3:.1f} | "
                   f"{r['cached_s'] * 1e6:.1f} |")
    w = c["workload"]
    out.append(f"\ncache over {w['requests']} requests drawing {w['distinct_schemas']} schemas ({w['draw']}): "
               f"{w['hits']} hits, {w['compiles']} compiles, hit rate {w['hit_rate']:.1%}; {w['compile_seconds']:.2f} s "
               f"compiling vs {w['compile_seconds_without_cache']:.2f} s without the cache")
    if res.get("served_compile"):
        s = res["served_compile"]
        out.append(f"\nserved TTFT: unguided {s['ttft_unguided_s'] * 1e3:.0f} ms; first guided request after the "
                   f"start {s['ttft_first_guided_after_start_s'] * 1e3:.0f} ms\n")
        out.append("| schema | TTFT, never-seen schema ms | TTFT, same schema again ms |")
        out.append("|---|---|---|")
        for r in s["rows"]:
            out.append(f"| {r['schema']} | {r['ttft_new_schema_s'] * 1e3:.0f} | {r['ttft_same_schema_again_s'] * 1e3:.0f} |")
    out.append("\n(a) mask per token, in-process (one sequence, vocabulary-wide float32 row)\n")
    out.append("| schema | tokens | mask ms mean | median | max | inside strings | outside | fill_next_token_bitmask ms | "
               "advance us |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in res["mask"]:
        ins = "-" if r["mask_ms_mean_inside_strings"] is None else f"{r['mask_ms_mean_inside_strings']:.2f}"
        out.append(f"| {r['schema']} | {r['tokens']} | {r['mask_ms_mean']:.2f} | {r['mask_ms_median']:.2f} | "
                   f"{r['mask_ms_max']:.1f} | {ins} | {r['mask_ms_mean_outside_strings']:.2f} | "
                   f"{r['fill_bitmask_ms_mean']:.2f} | {r['advance_ms_mean'] * 1e3:.0f} |")
    if res.get("cost"):
        out.append("\n(a) served, Triton ensemble, greedy, closed loop\n")
        out.append("| concurrency | constraint | requests | out tokens (mean) | TPOT p50 ms | ITL p50 ms | TTFT p50 ms | "
                   "out tok/s | TPOT vs none | tok/s vs none | valid answers | cut by max_tokens |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        base = {r["concurrency"]: r for r in res["cost"] if r["constraint"] == "none"}
        for r in res["cost"]:
            b = base[r["concurrency"]]
            rel = lambda k: "" if r is b else f"{100 * (r[k] / b[k] - 1):+.0f}%"  # noqa: E731
            out.append(f"| {r['concurrency']} | {r['constraint']} | {r['requests']} | {r['output_tokens_mean']:.1f} | "
                       f"{r['tpot_p50_s'] * 1e3:.1f} | {r['itl_p50_s'] * 1e3:.1f} | {r['ttft_p50_s'] * 1e3:.0f} | "
                       f"{r['output_token_throughput']:.1f} | {rel('tpot_p50_s')} | {rel('output_token_throughput')} | "
                       f"{r['valid']}/{r['checked']} | {(r['failures_by_cause'] or {}).get('cut_by_max_tokens', 0)} |")
    if res.get("validity"):
        out.append("\n(c) free-form prompts through /v1/chat/completions\n")
        out.append("| constraint | valid JSON objects | share | cut by max_tokens (of which looping) | other failures | "
                   "requests failed | out tokens (mean) | out tok/s |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in res["validity"]:
            f = dict(r["failures_by_cause"] or {})
            cut = f.pop("cut_by_max_tokens", 0)
            other = ", ".join(f"{k} {v}" for k, v in f.items()) or "none"
            share = f"{r['valid'] / r['checked']:.1%}" if r["checked"] else "-"
            out.append(f"| {r['constraint']} | {r['valid']}/{r['checked']} | {share} | "
                       f"{cut} ({r['cut_and_looping']}) | {other} | {r['failed']} | "
                       f"{r['output_tokens_mean'] or 0:.1f} | {r['output_token_throughput'] or 0:.1f} |")
        out.append("\n| language | " + " | ".join(r["constraint"] for r in res["validity"]) + " |")
        out.append("|---|" + "---|" * len(res["validity"]))
        for lg in PROMPT_SETS:
            cells = []
            for r in res["validity"]:
                d = r["by_language"].get(lg, {"checked": 0, "valid": 0})
                cells.append(f"{d['valid']}/{d['checked']}")
            out.append(f"| {lg} | " + " | ".join(cells) + " |")
    return "\n".join(out)


class _Served:
    """What frontend_launch reads of a ServerConfig: the server started here (address, gRPC URL, repository)."""

    def __init__(self, grpc_url: str, model_repository: Path):
        self.address, self.grpc_url, self.model_repository = grpc_url.rsplit(":", 1)[0], grpc_url, model_repository


def _parts(res: dict, parts: set, args, grpc: str, metrics: str, openai_url: str, engine: Path, tmp: Path) -> None:
    if "b" in parts:
        res["served_compile"] = served_compile(grpc, ["person (4)", "order (nested, 14)", "wide-200"])
    if "a" in parts:
        res["cost"] = cost_phase(grpc, metrics, engine, tmp, [int(x) for x in args.concurrency.split(",")],
                                 args.max_tokens, args.per_point)
    if "c" in parts:
        res["validity"] = validity_phase(openai_url, engine, tmp, args.prompts, args.free_concurrency,
                                         args.free_max_tokens, tuple(args.free_arms.split(",")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, default=Path("build/smollm2-135m/cpu"))
    ap.add_argument("--build-file", default="configs/builds/smollm2-135m.yaml")
    ap.add_argument("--concurrency", default="1,4", help="(a) closed-loop concurrencies")
    ap.add_argument("--max-tokens", type=int, default=64, help="(a) max_tokens of each request")
    ap.add_argument("--per-point", type=int, default=3, help="(a) measured requests per point = this x concurrency")
    ap.add_argument("--compile-reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="(b) requests of the cache workload")
    ap.add_argument("--variants", type=int, default=8, help="(b) distinct schemas of the cache workload")
    ap.add_argument("--prompts", type=int, default=200, help="(c) free-form prompts")
    ap.add_argument("--free-max-tokens", type=int, default=64, help="(c) max_tokens of each free-form request")
    ap.add_argument("--free-arms", default="constrained,free",
                    help="(c) which arms: constrained (json_object), free (the prompt alone asks for JSON)")
    ap.add_argument("--free-concurrency", type=int, default=8, help="(c) closed-loop concurrency")
    ap.add_argument("--frontend-model", default="tensorrt_llm_bls",
                    help="(c) the Triton model the OpenAI frontend sends to (tensorrt_llm_bls, as `trtpipe serve` "
                         "starts it, or ensemble)")
    ap.add_argument("--parts", default="a,b,c", help="which parts to run (in-process (a)/(b) always run)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    engine = args.build / "engine"
    repo = args.build / "model_repo"
    if not (repo / "ensemble" / "config.pbtxt").is_file():
        raise SystemExit(f"{repo}: no model repository; run `make build-engine` first")
    parts = set(args.parts.split(","))
    t_all = time.perf_counter()
    load0 = os.getloadavg()
    res: dict = {"date": time.strftime("%Y-%m-%d"), "args": {k: str(v) for k, v in vars(args).items()},
                 "host": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count(), "loadavg_at_start": load0}}
    res["compile"], g = compile_phase(engine, args.compile_reps, args.requests, args.variants, seed=0)
    res["mask"] = mask_phase(engine, g)
    if parts & {"a", "b", "c"}:
        from builders.layout import resolve_build
        from pipeline.launch_config import frontend_launch
        from pipeline.serve import OpenAIFrontend, free_ports

        build = resolve_build(args.build_file, "cpu")
        with tempfile.TemporaryDirectory() as tmp, serve_repository(repo, log_dir=Path(tmp)) as (grpc, metrics):
            # the frontend is started here, not by serve_repository, to choose the Triton model it sends to
            launch = frontend_launch(build, _Served(grpc, repo), free_ports(1)[0], engine)
            launch.triton_model = args.frontend_model
            launch.log_file = Path(tmp) / "openai_frontend.log"
            frontend = OpenAIFrontend(launch).start()
            openai_url = launch.url + "/v1"
            res["frontend_triton_model"] = args.frontend_model
            try:
                _parts(res, parts, args, grpc, metrics, openai_url, engine, Path(tmp))
            finally:
                frontend.stop(10)
    res["wall_s"] = time.perf_counter() - t_all

    res["host"]["loadavg_at_end"] = os.getloadavg()
    if args.json:  # first: the numbers are kept whatever the tables do
        args.json.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    print(tables(res))
    print(f"\nwall {res['wall_s']:.0f} s; load average at start {load0[0]:.2f}, at end {res['host']['loadavg_at_end'][0]:.2f}")
    if args.json:
        print(f"wrote {args.json}")
    bad = [f"{r['constraint']} (c={r['concurrency']}): {'; '.join(r['validity_reasons'])}"
           for r in res.get("cost", []) + res.get("validity", []) if not r["point_valid"]]
    if bad:
        print("INVALID points (not measurements of the server):\n  " + "\n  ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
