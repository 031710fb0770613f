"""Pre-flight checks that run before any heavy step.

``check(build, target)`` needs only the spec and the target profile; ``check_model(build,
target, hf_dir)`` also reads the model's config.json (no weights). Both collect every
violated rule and raise one :class:`~pipeline.errors.SpecError` listing them all.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import Problem, SpecError
from pipeline.spec import ResolvedBuild
from pipeline.targets import TargetProfile


def spec_problems(build: ResolvedBuild, target: TargetProfile) -> list[Problem]:
    """Rules that need only the spec and the target."""
    s = build.settings
    t = f"targets.{build.target}"
    problems: list[Problem] = []
    if s.runtime not in target.runtimes:
        problems.append(Problem(f"{t}.runtime", s.runtime, f"runtime '{s.runtime}' cannot run on target "
                                f"'{target.name}' (it supports {list(target.runtimes)})",
                                "use runtime: pytorch on CPU targets, or pick a GPU target", code="runtime_target"))
    lim = s.limits
    if lim.max_seq_len < lim.max_input_len + 1:
        problems.append(Problem("limits.max_seq_len", lim.max_seq_len,
                                f"max_seq_len must be at least max_input_len + 1 = {lim.max_input_len + 1} "
                                "(room for one generated token)",
                                f"set limits.max_seq_len >= {lim.max_input_len + 1}", code="seq_len_vs_input"))
    tmbs = s.serving.triton_max_batch_size
    if tmbs is not None and tmbs > lim.max_batch_size:
        problems.append(Problem("serving.triton_max_batch_size", tmbs,
                                f"Triton's max_batch_size must not exceed the engine's max_batch_size "
                                f"{lim.max_batch_size}", "lower it or raise limits.max_batch_size",
                                code="triton_batch_vs_engine"))
    if s.serving.decoupled is False and s.serving.streaming:
        problems.append(Problem("serving.decoupled", False, "streaming needs the decoupled transaction policy",
                                "remove serving.decoupled or set it to true", code="streaming_decoupled"))
    return problems


def check(build: ResolvedBuild, target: TargetProfile) -> None:
    """Raise SpecError when the spec breaks a rule that needs no model files."""
    problems = spec_problems(build, target)
    if problems:
        raise SpecError(problems, build.spec_path)


def model_problems(build: ResolvedBuild, hf_config: dict) -> list[Problem]:
    """Rules that need the model's config.json: divisibility of heads/layers/dims by tp/pp/group size."""
    s = build.settings
    tp, pp = s.parallelism.tp_size, s.parallelism.pp_size
    heads = hf_config["num_attention_heads"]
    layers = hf_config["num_hidden_layers"]
    hidden = hf_config["hidden_size"]
    inter = hf_config.get("intermediate_size", 4 * hidden)
    problems: list[Problem] = []
    if heads % tp:
        ok = [d for d in range(1, heads + 1) if heads % d == 0]
        problems.append(Problem("parallelism.tp_size", tp, f"num_attention_heads ({heads}) must be divisible "
                                f"by tp_size", f"use tp_size in {ok}", code="heads_tp"))
    if layers % pp:
        ok = [d for d in range(1, layers + 1) if layers % d == 0]
        problems.append(Problem("parallelism.pp_size", pp, f"num_hidden_layers ({layers}) must be divisible "
                                f"by pp_size (ModelOpt's exporter splits layers evenly)",
                                f"use pp_size in {ok}", code="layers_pp"))
    from builders.quantize import QUANT_RECIPES

    q = s.quantization
    if QUANT_RECIPES[q.quant_algo].uses_group_size:
        # Row-parallel layers (o_proj, down_proj) split their input dim by tp; column-parallel keep it.
        for name, dim in (("hidden_size", hidden), ("hidden_size/tp (o_proj input)", hidden // tp),
                          ("intermediate_size/tp (down_proj input)", inter // tp)):
            if dim % q.group_size:
                problems.append(Problem("quantization.group_size", q.group_size,
                                        f"{name} = {dim} is not a multiple of group_size",
                                        "use a group_size that divides it (64 or 32), or change tp_size",
                                        code="awq_group"))
                break
    max_pos = hf_config.get("max_position_embeddings")
    rope = hf_config.get("rope_scaling") or (hf_config.get("rope_parameters") or {})
    scaled = rope.get("rope_type", rope.get("type", "default")) not in ("default", None)
    if max_pos and s.limits.max_seq_len > max_pos and not scaled:
        problems.append(Problem("limits.max_seq_len", s.limits.max_seq_len,
                                f"above the model's max_position_embeddings {max_pos} with no rope scaling",
                                f"set limits.max_seq_len <= {max_pos}", code="seq_len_context"))
    return problems


def check_model(build: ResolvedBuild, target: TargetProfile, hf_dir: Path) -> None:
    """Raise SpecError when the spec does not fit the model in ``hf_dir``."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    problems = model_problems(build, cfg)
    if problems:
        raise SpecError(problems, build.spec_path)
