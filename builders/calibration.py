"""Calibration and held-out evaluation text.

``pydoc_topics`` is the prose of the Python standard library's ``pydoc_data.topics`` (about
465k characters of English documentation, shipped with CPython, so it works offline). The
first 80% of the characters is the calibration split, the last 20% the evaluation split:
the two never overlap, so a quantized model is never scored on the text it was calibrated on.
"""

from __future__ import annotations

import random
from typing import Literal

CALIBRATION_FRACTION = 0.8


def corpus_text(dataset: str = "pydoc_topics") -> str:
    """The whole corpus as one string (topics joined in sorted key order, deterministic)."""
    if dataset != "pydoc_topics":
        raise ValueError(f"unknown calibration dataset {dataset!r}; known: pydoc_topics")
    import pydoc_data.topics as topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def split_text(split: Literal["calibration", "evaluation"], dataset: str = "pydoc_topics") -> str:
    """Return the calibration (first 80%) or evaluation (last 20%) part of the corpus."""
    text = corpus_text(dataset)
    cut = int(len(text) * CALIBRATION_FRACTION)
    return text[:cut] if split == "calibration" else text[cut:]


def token_windows(tokenizer, split: Literal["calibration", "evaluation"], num_samples: int, seq_len: int,
                  seed: int, dataset: str = "pydoc_topics") -> list[list[int]]:
    """Sample ``num_samples`` windows of ``seq_len`` token ids from one split.

    Windows start at seeded random, non-overlapping offsets (evaluation windows are taken in
    order from the start of the split so every build scores the same text).

    Returns:
        list of ``num_samples`` lists of ``seq_len`` ints.

    Raises:
        ValueError: the split is too short for the request.
    """
    ids = tokenizer(split_text(split, dataset), add_special_tokens=False)["input_ids"]
    n_windows = len(ids) // seq_len
    if n_windows < num_samples:
        raise ValueError(f"{split} split has {len(ids)} tokens: room for {n_windows} windows of {seq_len}, "
                         f"{num_samples} requested; lower num_samples or seq_len")
    if split == "evaluation":
        starts = [i * seq_len for i in range(num_samples)]
    else:
        starts = sorted(random.Random(seed).sample(range(n_windows), num_samples))
        starts = [s * seq_len for s in starts]
    return [ids[s:s + seq_len] for s in starts]
