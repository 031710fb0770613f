"""Write the shipped lm-eval tasks built from held-out text: pipeline/eval_tasks/lastword.jsonl (trtpipe_lastword, a
LAMBADA-style last-word task) and cloze.jsonl (trtpipe_cloze, a four-way multiple-choice cloze).

The text is the evaluation split of builders.calibration's ``pydoc_topics`` corpus (the last 20% of CPython's
``pydoc_data.topics``, never seen by calibration; Python Software Foundation License, redistributable with its
notice: pipeline/eval_tasks/NOTICE). Only prose paragraphs are used (no doctest, table or code lines).

- lastword: a passage of up to 80 words that ends just before a word of 5 or more letters which occurs earlier in
  the passage, as in LAMBADA (Paperno et al., 2016), where the target is predictable from the broad context.
  Scored as lm-eval's lambada_openai is: ``loglikelihood`` of " " + word, metrics ``perplexity`` and ``acc`` (the
  word is the greedy continuation).
- cloze: a passage of up to 60 words that ends just before a lower-case word of 5 or more letters; the choices are
  that word and three others of the held-out text within two letters of its length, shuffled.

Deterministic (seed 0). Run from the project root: ``.venv/bin/python scripts/make_eval_tasks.py``; the written files
are committed, so a CPython whose pydoc topics differ does not change the task.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from builders.calibration import split_text  # noqa: E402

OUT = ROOT / "pipeline" / "eval_tasks"
ITEMS = 200
WORD = re.compile(r"^[A-Za-z]+$")


def paragraphs(text: str) -> list[list[str]]:
    """Prose paragraphs of ``text`` as word lists: runs of unindented lines (pydoc indents code, doctests and
    grammar) that are not list or table lines, 12 words or more."""
    out, cur = [], []
    for line in text.splitlines():
        s = line.strip()
        if s and not line.startswith((" ", "\t")) and not s.startswith(("*", "-", "=", "+", "|")):
            cur += s.split()
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return [p for p in out if len(p) >= 12]


def _bare(word: str) -> str:
    return word.strip(".,;:!?()\"'")


def lastword_items(paras: list[list[str]], rng: random.Random) -> list[dict]:
    items = []
    for words in paras:
        for i, w in enumerate(words):
            target = w.rstrip(".,;:!?")
            if i < 15 or not WORD.match(target) or len(target) < 5:
                continue
            context = words[max(0, i - 80):i]
            if target.lower() in {_bare(c).lower() for c in context}:
                items.append({"context": " ".join(context), "target": target})
    rng.shuffle(items)
    return items[:ITEMS]


def cloze_items(paras: list[list[str]], rng: random.Random) -> list[dict]:
    vocab = sorted({w for words in paras for w in words if WORD.match(w) and len(w) >= 5 and w.islower()})
    by_len: dict[int, list[str]] = {}
    for w in vocab:
        by_len.setdefault(len(w), []).append(w)
    candidates = []
    for words in paras:
        for i, w in enumerate(words):
            if i < 15 or not WORD.match(w) or len(w) < 5 or not w.islower() or words[i - 1].endswith((".", "!", "?")):
                continue
            candidates.append((words, i))
    rng.shuffle(candidates)
    items, seen = [], set()
    for words, i in candidates:
        word, context = words[i], " ".join(words[max(0, i - 60):i])
        if context in seen:
            continue
        pool = [v for n in range(len(word) - 2, len(word) + 3) for v in by_len.get(n, []) if v != word]
        choices = [word, *rng.sample(pool, 3)]
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices, "answer": choices.index(word)})
        seen.add(context)
        if len(items) == ITEMS:
            break
    return items


def main() -> int:
    paras = paragraphs(split_text("evaluation"))
    rng = random.Random(0)
    for name, items in (("lastword", lastword_items(paras, rng)), ("cloze", cloze_items(paras, rng))):
        if len(items) < ITEMS:
            raise SystemExit(f"{name}: only {len(items)} items in the held-out text, {ITEMS} wanted")
        path = OUT / f"{name}.jsonl"
        path.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
        print(f"{path.relative_to(ROOT)}: {len(items)} items")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
