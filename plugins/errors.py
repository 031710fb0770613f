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


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest of ``choices`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""
