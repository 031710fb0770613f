"""Errors the pipeline raises on bad input, all reported at once.

A `SpecError` carries one or more `Problem` entries, each naming the YAML field (dotted
path), the offending value, the rule it breaks and the fix. The CLI prints them and exits
with status 2 before any expensive step runs.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Problem:
    """One violated rule.

    Attributes:
        field: dotted path of the YAML field, e.g. ``targets.h100.parallelism.tp_size``.
        value: the value found (``None`` when the field is missing).
        rule: the rule, stated as a fact ("num_attention_heads (9) must be divisible by tp_size").
        fix: what to change, as an instruction.
        code: a stable identifier of the rule (tests and tools match on it; messages may change).
    """

    field: str
    value: Any
    rule: str
    fix: str
    code: str = "invalid"

    def render(self) -> str:
        return f"{self.field} = {self.value!r}: {self.rule}. Fix: {self.fix}"


class PipelineError(Exception):
    """Base class for errors reported to users with a clear message (exit status 2)."""


class SpecError(PipelineError):
    """A build spec (or its combination with a target/model) violates one or more rules."""

    def __init__(self, problems: Iterable[Problem], source: str | None = None, what: str = "the build spec"):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        n = len(self.problems)
        lines = [f"{head}{n} problem{'s' if n != 1 else ''} in {what}:"]
        lines += [f"  - {p.render()}" for p in self.problems]
        super().__init__("\n".join(lines))

    def codes(self) -> list[str]:
        return [p.code for p in self.problems]

    def fields(self) -> list[str]:
        return [p.field for p in self.problems]


class StageError(PipelineError):
    """A pipeline stage failed after its inputs were validated (the message says why and what to do)."""


class WriteError(PipelineError):
    """A folder trtpipe writes cannot take the write: the disk is full (ENOSPC, EDQUOT), it is read-only (EROFS),
    no permission (EACCES) or a file is in the way (ENOTDIR). The message names the path, the reason and the fix.

    Attributes:
        path: the file or folder that could not be written.
        errno: the reason, as an ``errno`` code.
    """

    def __init__(self, message: str, path=None, errno: int | None = None):
        super().__init__(message)
        self.path = path
        self.errno = errno


KEY_ALIASES: dict[str, tuple[str, ...]] = {
    "tp_size": ("tp", "tensor_parallel", "tensor_parallel_size", "tensor_parallelism"),
    "pp_size": ("pp", "pipeline_parallel", "pipeline_parallel_size", "pipeline_parallelism"),
    "moe_ep_size": ("ep", "ep_size", "expert_parallel", "expert_parallel_size", "moe_expert_parallel_size"),
    "moe_tp_size": ("moe_tp", "moe_tensor_parallel_size"),
    "max_num_tokens": ("max_tokens", "max_batch_tokens", "max_num_batched_tokens"),
    "tokens_per_block": ("block_size", "kv_block_size", "page_size"),
    "quant_algo": ("algo", "quant", "quant_mode", "quant_method"),
    "kv_cache_quant_algo": ("kv_cache_dtype", "kv_quant", "kv_cache_quant"),
    "max_seq_len": ("max_model_len", "max_sequence_length", "max_seq_length"),
}
"""Names other tools give our keys (vLLM ``tensor_parallel_size``/``max_model_len``/``block_size``/
``max_num_batched_tokens``, TensorRT-LLM's LLM API ``tensor_parallel_size``/``pipeline_parallel_size``/
``moe_expert_parallel_size``, transformers' continuous batching ``max_batch_tokens``, ModelOpt's ``algo``): an unknown
key that is one of them gets the key it stands for as its did-you-mean, where that key is allowed."""

_ALIAS_OF = {alias: key for key, aliases in KEY_ALIASES.items() for alias in aliases}


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def _best_key(name: str, keys: Iterable[str], cutoff: float) -> tuple[str, float] | None:
    """The key of ``keys`` that ``name`` is, with a score: the key itself or one of its :data:`KEY_ALIASES` (2.0),
    else the closest spelling (difflib ratio >= ``cutoff``) of the key or of one of its aliases (a misspelt alias)."""
    keys = list(keys)
    norm = _norm(name)
    if norm in keys:
        return norm, 2.0
    alias = _ALIAS_OF.get(norm)
    if alias in keys:
        return alias, 2.0
    spelled = {k: k for k in keys} | {a: k for k in keys for a in KEY_ALIASES.get(k, ())}
    close = difflib.get_close_matches(norm, list(spelled), n=1, cutoff=cutoff)
    if not close:
        return None
    return spelled[close[0]], difflib.SequenceMatcher(None, norm, close[0]).ratio()


def did_you_mean(name: str, choices: Iterable[str], elsewhere: Iterable[str] = ()) -> str:
    """Return ``" Did you mean 'x'?"`` for the key of ``choices`` that ``name`` stands for, else ``""``.

    Looked for: a key of ``choices`` that ``name`` is (ignoring case and ``-``), stands for
    (:data:`KEY_ALIASES`), or is a close spelling of (of the key or of one of its aliases: a misspelt
    ``tensor_paralel_size`` gets ``tp_size``); and the same for the last part of each
    dotted path of ``elsewhere`` (every key of the spec, at any level), answered with that path where it matches
    better (exactly, or a closer spelling) than any key here: ``max_batch_size`` or ``max_batch_szie`` under
    ``serving`` gets ``" Did you mean 'limits.max_batch_size'?"``.
    """
    here = _best_key(name, choices, 0.6)
    by_leaf: dict[str, str] = {}
    for path in elsewhere:
        by_leaf.setdefault(path.rsplit(".", 1)[-1], path)
    there = _best_key(name, by_leaf, 0.7)
    if there is not None and (here is None or there[1] > here[1]):
        return f" Did you mean '{by_leaf[there[0]]}'?"
    return f" Did you mean '{here[0]}'?" if here is not None else ""
