"""The ``tensorrt_llm`` models' config.pbtxt parameters: how they are read, and the portable runtime's fixed
choices with their defaults (one table for the plan, the generator and the served model).

Triton gives a Python model its config as JSON (``args["model_config"]``); each ``parameters`` entry is
``{"key": {"string_value": "..."}}`` (Triton's model_config.proto ``ModelParameter``).
"""

from __future__ import annotations

PORTABLE_RUNTIME_CHOICES: tuple[tuple[str, str, str], ...] = (
    ("cuda_graph_mode", "auto", "transformers decides whether to capture CUDA graphs"),
    ("async_batching", "false", "the per-request sampling processors need synchronous batching"),
    ("library_defaults", "false", "the planner's sizes (KV pool, blocks, batch token budget), not transformers' own"),
    ("engine_process", "true", "the generation loop runs in its own process (engine_worker.py), not in the stub's "
     "interpreter; false runs it in the stub"),
    ("engine_python", "", "the worker's python; empty: one of the stub's Python version"),
    ("sdpa_backends", "flash,mem_efficient,math", "every attention kernel but cuDNN's (its per-shape plans slow "
     "each new batch shape); 'auto' leaves the choice to torch"),
    ("response_dispatch", "thread", "with engine_process false: a dispatcher thread sends responses ('inline': the "
     "generation thread does)"),
)
"""The portable runtime's fixed choices (name, value, reason), written into plan.json and the tensorrt_llm model's
config.pbtxt; the served model falls back to the same value where a parameter is absent. Measurements behind
them: docs/benchmarks/h200.md."""

CHOICE_DEFAULTS = {name: value for name, value, _ in PORTABLE_RUNTIME_CHOICES}


def param(cfg: dict, key: str, default: str | None = None) -> str | None:
    """A config.pbtxt string parameter of the model config ``cfg``; ``default`` when absent, empty or an
    unfilled ``${...}`` placeholder."""
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", None)
    if value is None or value == "" or value.startswith("${"):
        return default
    return value


def choice(cfg: dict, key: str) -> str:
    """One of :data:`PORTABLE_RUNTIME_CHOICES` from ``cfg``, its table value where absent.

    Raises:
        KeyError: ``key`` is not a choice of the table.
    """
    return param(cfg, key, CHOICE_DEFAULTS[key])


def flag(value, default=None):
    """'true'/'false'/'auto'/'' (a config.pbtxt string parameter) -> True/False/``default``."""
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("", "auto", "none", "default"):
        return default
    return text in ("1", "true", "yes", "on")
