"""``trtpipe tune``: the build and runtime settings with the most goodput per GPU under a TTFT/TPOT target.

The search: quantization recipe x KV-cache dtype x tp_size x pp_size (x moe_ep_size x enable_attention_dp) x
max_batch_size x max_num_tokens x serving.kv_cache_free_gpu_mem_fraction. Every candidate goes through the pre-flight rules and
the memory plan (builders.preflight.make_plan, the same code ``trtpipe plan`` runs): refused candidates are
dropped with their rule. Recipes whose measured perplexity delta exceeds ``--max-ppl-delta-pct`` are dropped:
the delta comes from a ``verify.json`` of a build of this build file, else from the recorded quantization table
(``docs/benchmarks/quantization.json``, SmolLM2-135M). The survivors' speed is predicted by NVIDIA aiconfigurator
(builders.perf_model) at the concurrency each can hold (``min(max_batch_size, sequences of ISL+OSL the KV pool
holds)``); goodput per GPU is the predicted output tokens/s per GPU of a candidate that meets both targets, 0
otherwise (all requests of a steady aggregated load are alike, so a candidate meets the SLO for all or none).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import yaml

from builders import perf_calibration, perf_model, preflight
from builders.layout import build_root
from builders.plan import Plan
from builders.spec import ResolvedBuild, parse_build_file, read_yaml, resolve_target
from plugins.errors import Problem, SpecError
from plugins.recipes import QUANT_RECIPES
from plugins.targets import TargetProfile

BATCH_SIZES = (8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
"""max_batch_size values searched (aiconfigurator's own agg sweep steps as finely above 64)."""
MAX_NUM_TOKENS = (2048, 4096, 8192, 16384)
KV_FRACTIONS = (0.9, 0.95)
PP_SIZES = (1, 2, 4, 8)
DEFAULT_MAX_PPL_DELTA_PCT = 5.0
RECORDED_ACCURACY = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "quantization.json"


@dataclass(frozen=True)
class Slo:
    """The workload and the latency targets (ms)."""

    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class Candidate:
    """One point of the search: the spec fields it sets."""

    quant_algo: str
    kv_cache_quant_algo: Optional[str]
    tp_size: int
    pp_size: int
    moe_ep_size: Optional[int]
    max_batch_size: int
    max_num_tokens: int
    kv_cache_free_gpu_mem_fraction: float
    enable_attention_dp: bool = False

    def overrides(self) -> dict:
        """The nested spec override (what ``targets.<target>`` of the written build file holds)."""
        par = {"tp_size": self.tp_size, "pp_size": self.pp_size}
        if self.moe_ep_size is not None:
            par.update(moe_ep_size=self.moe_ep_size, moe_tp_size=self.tp_size // self.moe_ep_size,
                       enable_attention_dp=self.enable_attention_dp)
        return {"quantization": {"quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo},
                "parallelism": par,
                "limits": {"max_batch_size": self.max_batch_size, "max_num_tokens": self.max_num_tokens},
                "serving": {"kv_cache_free_gpu_mem_fraction": self.kv_cache_free_gpu_mem_fraction}}

    @property
    def gpus(self) -> int:
        return self.tp_size * self.pp_size

    def label(self) -> str:
        ep = f" ep{self.moe_ep_size}" if self.moe_ep_size else ""
        ep += " attention-dp" if self.enable_attention_dp else ""
        return (f"{self.quant_algo}/kv {self.kv_cache_quant_algo or '16-bit'} tp{self.tp_size} pp{self.pp_size}{ep} "
                f"bs{self.max_batch_size} mnt{self.max_num_tokens} kv{self.kv_cache_free_gpu_mem_fraction}")


@dataclass
class Scored:
    """A candidate after the rules, the accuracy filter and the prediction."""

    candidate: Candidate
    refused: str = ""
    """The rule (code and field) that dropped it; empty when it runs."""
    concurrency: int = 0
    prediction: dict = field(default_factory=dict)
    ppl_delta_pct: Optional[float] = None
    meets_slo: bool = False
    misses: str = ""
    """What it misses the targets by (empty when it meets them)."""

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return float(self.prediction.get("tokens_per_s_per_gpu") or 0.0)

    @property
    def goodput_per_gpu(self) -> float:
        return self.tokens_per_s_per_gpu if self.meets_slo else 0.0

    @property
    def excess(self) -> float:
        """How far past the worse of the two targets (1.0 = on it); inf without a prediction."""
        p = self.prediction
        if not p.get("ok"):
            return float("inf")
        return max(p["ttft_ms"] / self.slo.ttft_ms, p["tpot_ms"] / self.slo.tpot_ms)

    slo: Optional[Slo] = None


@dataclass
class TuneResult:
    slo: Slo
    gpus: int
    scored: list[Scored]
    best: Optional[Scored]
    accuracy: dict[str, tuple[Optional[float], str]]
    refusals: dict[str, int]
    """How many candidates each rule dropped (rule code: count)."""
    predicted_points: int
    cached_points: int
    elapsed_s: float
    backend_version: Optional[str] = None
    max_ppl_delta_pct: Optional[float] = DEFAULT_MAX_PPL_DELTA_PCT

    @property
    def ranked(self) -> list[Scored]:
        ok = [s for s in self.scored if not s.refused and s.prediction.get("ok")]
        return sorted(ok, key=lambda s: (-s.goodput_per_gpu, s.candidate.gpus, s.excess))

    def pareto(self) -> list[Scored]:
        """Candidates no other beats on both tokens/s per GPU and tokens/s per user (the usual throughput-latency
        frontier), best throughput first."""
        ok = [s for s in self.scored if not s.refused and s.prediction.get("ok")]
        front = []
        for s in sorted(ok, key=lambda s: (-s.tokens_per_s_per_gpu, -s.prediction["tokens_per_s_per_user"])):
            if not front or s.prediction["tokens_per_s_per_user"] > front[-1].prediction["tokens_per_s_per_user"]:
                front.append(s)
        return front

    def closest(self, n: int = 5) -> list[Scored]:
        ok = [s for s in self.scored if not s.refused and s.prediction.get("ok")]
        return sorted(ok, key=lambda s: (s.excess, -s.tokens_per_s_per_gpu))[:n]


def accuracy_by_recipe(build: ResolvedBuild) -> dict[str, tuple[Optional[float], str]]:
    """Perplexity delta (%) of each recipe and where it was measured.

    A ``verify.json`` under ``build/<name>/*/verify/`` (a build of this build file; the worst one per recipe)
    wins over the recorded table ``docs/benchmarks/quantization.json`` (SmolLM2-135M; larger models lose less).
    verify.json names TensorRT-LLM's quant_algo, which int4_awq, int4_rtn and int4_gptq share: all get it.
    """
    out: dict[str, tuple[Optional[float], str]] = {name: (None, "not measured") for name in QUANT_RECIPES}
    if RECORDED_ACCURACY.is_file():
        table = json.loads(RECORDED_ACCURACY.read_text())
        model = table.get("meta", {}).get("model", "recorded table")
        for row in table.get("smollm2", []):
            if row.get("quant") in out and row.get("perplexity_delta_pct") is not None:
                out[row["quant"]] = (float(row["perplexity_delta_pct"]), f"recorded on {model.split(' (')[0]}")
    measured: dict[str, float] = {}
    for f in sorted((build_root() / build.name).glob("*/verify/verify.json")):
        try:
            report = json.loads(f.read_text())
            delta = float(report["metrics"]["perplexity_delta_pct"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for name, rec in QUANT_RECIPES.items():
            if rec.quant_algo == report.get("quant_algo"):
                measured[name] = max(delta, measured.get(name, delta))
                out[name] = (measured[name], f"verify.json of this build ({f.parent.parent.name})")
    return out


def gpus_problem(gpus: int, target: TargetProfile) -> Problem:
    """The Problem of a GPU count below 1 for ``trtpipe tune --gpus``: one instance needs a GPU."""
    return Problem("--gpus", gpus, "the GPUs one instance may use (tp_size x pp_size) must be at least 1",
                   f"pass --gpus N with N >= 1, or leave --gpus out for target {target.name}'s gpus_per_node "
                   f"({target.gpus_per_node})", code="gpus_count")


def search_space(build: ResolvedBuild, target: TargetProfile, plan_shape, gpus: int) -> list[Candidate]:
    """Every candidate: recipes aiconfigurator can model x KV dtype (the build's, and 16-bit) x tp (divisors that
    split the heads) x pp x ep (MoE: 1 or tp) x attention DP (MoE at tp > 1 on an LLM-API runtime: off and on) x
    :data:`BATCH_SIZES` x :data:`MAX_NUM_TOKENS` x :data:`KV_FRACTIONS`, with tp x pp <= ``gpus``."""
    moe = plan_shape.is_moe
    recipes = [n for n, r in QUANT_RECIPES.items()
               if r.aiconfigurator_gemm is not None and (not moe or r.aiconfigurator_moe is not None)]
    kvs = sorted({build.settings.quantization.kv_cache_quant_algo, None}, key=lambda v: v or "")
    tps = [t for t in preflight.valid_tp_sizes(plan_shape) if t <= gpus]
    pars = [(t, p) for t in tps for p in PP_SIZES if t * p <= gpus and p <= plan_shape.num_hidden_layers]
    out = []
    for q, kv, (tp, pp) in itertools.product(recipes, kvs, pars):
        eps = sorted({1, tp}) if moe else [None]
        adps = (False, True) if moe and tp > 1 and build.runtime.llm_api else (False,)
        for ep, adp, bs, mnt, frac in itertools.product(eps, adps, BATCH_SIZES, MAX_NUM_TOKENS, KV_FRACTIONS):
            out.append(Candidate(q, kv, tp, pp, ep, bs, mnt, frac, adp))
    return out


def _first_problem(err: SpecError) -> str:
    p = err.problems[0]
    return f"{p.code or 'rule'}: {p.field}"


def tune(spec_path: Path, build: ResolvedBuild, target: TargetProfile, hf_config: dict, slo: Slo, *, gpus: int,
         max_ppl_delta_pct: Optional[float] = DEFAULT_MAX_PPL_DELTA_PCT,
         progress: Optional[Callable[[str, int, int], None]] = None) -> TuneResult:
    """Search, check, filter, predict and rank (module docstring). ``progress(phase, done, total)``; ``gpus``: the
    most GPUs one instance may use (tp x pp), at least 1.

    Raises:
        SpecError: ``gpus`` is below 1 (code ``gpus_count``; before any search).
        PerfModelUnavailable: aiconfigurator is missing or cannot model the build (its reason).
    """
    if gpus < 1:
        raise SpecError([gpus_problem(gpus, target)])
    t0 = time.monotonic()
    progress = progress or (lambda *_: None)
    why = perf_model.refusal(build, target, hf_config)
    if why:
        raise perf_model.PerfModelUnavailable(why)
    data = read_yaml(spec_path)
    bf = parse_build_file(data, str(spec_path))
    first = preflight.make_plan(build, target, hf_config, isl=slo.isl, osl=slo.osl)
    cands = search_space(build, target, first.model, gpus)
    accuracy = accuracy_by_recipe(build)
    scored: list[Scored] = []
    refusals: dict[str, int] = {}
    plans: dict[Candidate, tuple[ResolvedBuild, Plan]] = {}
    bad_groups: dict[tuple, str] = {}
    for i, c in enumerate(cands):
        if i % 50 == 0:
            progress("checking candidates against the rules", i, len(cands))
        s = Scored(c, slo=slo)
        delta = accuracy.get(c.quant_algo, (None, ""))[0]
        s.ppl_delta_pct = delta
        group = (c.quant_algo, c.kv_cache_quant_algo, c.tp_size, c.pp_size, c.moe_ep_size, c.enable_attention_dp)
        if max_ppl_delta_pct is not None and (delta is None or delta > max_ppl_delta_pct):
            s.refused = (f"accuracy: perplexity {'not measured' if delta is None else f'+{delta:.1f}%'} "
                         f"(limit {max_ppl_delta_pct:g}%)")
        elif group in bad_groups:
            s.refused = bad_groups[group]
        else:
            try:
                settings = resolve_target(bf, data, build.target, str(spec_path), c.overrides())
                cand_build = build.model_copy(update={"settings": settings})
                plans[c] = cand_build, preflight.make_plan(cand_build, target, hf_config, isl=slo.isl, osl=slo.osl)
            except SpecError as e:
                s.refused = _first_problem(e)
                codes = {p.code for p in e.problems}
                if not codes & {"weights_fit", "activations_fit", "kv_pool_one_seq", "memory_fit"} and \
                        not any(p.field.startswith(("limits.", "serving.")) for p in e.problems):
                    bad_groups[group] = s.refused  # a rule about the recipe or the sharding: the whole group
        if s.refused:
            key = s.refused.split(":")[0] if not s.refused.startswith("accuracy") else "accuracy"
            refusals[key] = refusals.get(key, 0) + 1
        scored.append(s)
    progress("checking candidates against the rules", len(cands), len(cands))

    points, where = [], {}
    for s in scored:
        if s.refused:
            continue
        cb, plan = plans[s.candidate]
        s.concurrency = plan.memory.kv.workload_concurrency
        if s.concurrency < 1:
            s.refused = "kv: no sequence of ISL+OSL fits"
            continue
        p = perf_model.at_concurrency(perf_model.base_point(cb, target, plan, hf_config), "trtllm", s.concurrency)
        k = json.dumps(p, sort_keys=True)
        if k not in where:
            where[k] = len(points)
            points.append(p)
        s.prediction = {"_index": where[k]}
    answers, cached = perf_model.estimate(points, progress=lambda d, t: progress("predicting (aiconfigurator)", d, t))
    version = None
    for s in scored:
        if s.refused:
            continue
        a = answers[s.prediction["_index"]]
        s.prediction = dict(a)
        if not a.get("ok"):
            s.refused = f"aiconfigurator: {a.get('error')}"
            continue
        plan = plans[s.candidate][1]  # ranked by aiconfigurator's numbers; the calibrated one is shown beside
        f = perf_calibration.factor_for(plan.serving_pp, plan.model.is_moe, attention_dp=plan.attention_dp_size > 1)
        s.prediction["tokens_per_s_per_gpu_calibrated"] = None if f is None else a["tokens_per_s_per_gpu"] * f
        version = version or a.get("backend_version")
        over = [f"TTFT {a['ttft_ms']:.0f} ms > {slo.ttft_ms:g}" for _ in [0] if a["ttft_ms"] > slo.ttft_ms]
        over += [f"TPOT {a['tpot_ms']:.1f} ms > {slo.tpot_ms:g}" for _ in [0] if a["tpot_ms"] > slo.tpot_ms]
        s.meets_slo = not over
        s.misses = ", ".join(over)
    result = TuneResult(slo=slo, gpus=gpus, scored=scored, best=None, accuracy=accuracy, refusals=refusals,
                        predicted_points=len(points), cached_points=cached, elapsed_s=0.0, backend_version=version,
                        max_ppl_delta_pct=max_ppl_delta_pct)
    ranked = result.ranked
    result.best = ranked[0] if ranked and ranked[0].meets_slo else None
    result.elapsed_s = round(time.monotonic() - t0, 2)
    return result


def _yaml_value(v) -> str:
    """A setting as the build file spells it (null, true, false)."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def reasons(result: TuneResult) -> list[str]:
    """One line per chosen setting: the most goodput per GPU any candidate with another value of it reaches (or
    the rule that refused them all)."""
    best = result.best
    if best is None:
        return []
    c = best.candidate
    lines = []
    knobs = (("quant_algo", "quantization.quant_algo"), ("kv_cache_quant_algo", "quantization.kv_cache_quant_algo"),
             ("tp_size", "parallelism.tp_size"), ("pp_size", "parallelism.pp_size"),
             ("moe_ep_size", "parallelism.moe_ep_size"),
             ("enable_attention_dp", "parallelism.enable_attention_dp"), ("max_batch_size", "limits.max_batch_size"),
             ("max_num_tokens", "limits.max_num_tokens"),
             ("kv_cache_free_gpu_mem_fraction", "serving.kv_cache_free_gpu_mem_fraction"))
    for attr, name in knobs:
        value = getattr(c, attr)
        if attr in ("moe_ep_size", "enable_attention_dp") and c.moe_ep_size is None:
            continue
        others = [s for s in result.scored if getattr(s.candidate, attr) != value]
        runs = [s for s in others if not s.refused and s.prediction.get("ok")]
        head = f"{name} {_yaml_value(value)}"
        if not runs:
            why = {}
            for s in others:
                why[s.refused] = why.get(s.refused, 0) + 1
            common = max(why, key=why.get) if why else "no other value searched"
            lines.append(f"{head}: every other value refused ({common})")
            continue
        alt = max(runs, key=lambda s: (s.goodput_per_gpu, -s.excess))
        va = _yaml_value(getattr(alt.candidate, attr))
        got = (f"at most {alt.goodput_per_gpu:,.0f} tok/s/GPU ({alt.candidate.label()})" if alt.meets_slo
               else f"nothing within the SLO (closest {alt.candidate.label()}: {alt.misses})")
        if alt.meets_slo and alt.goodput_per_gpu >= best.goodput_per_gpu:
            got = f"as much ({alt.candidate.label()}); the first in the search order is kept"
        lines.append(f"{head}: {best.goodput_per_gpu:,.0f} tok/s/GPU; another value ({va}) gives {got}")
    return lines


def tuned_build_file(spec_path: Path, out_path: Path, build: ResolvedBuild, result: TuneResult) -> str:
    """The YAML text of a build file: ``spec_path``'s content with ``targets.<target>`` set to the choice,
    relative paths rebased to ``out_path``'s folder, and the reasons as comments at the top."""
    best = result.best
    data = read_yaml(spec_path)
    over = best.candidate.overrides()
    targets = data.setdefault("targets", {}) or {}
    merged = dict(targets.get(build.target) or {})
    for k, v in over.items():
        merged[k] = {**(merged.get(k) or {}), **v}
    targets[build.target] = merged
    data["targets"] = targets

    data["name"] = f"{data.get('name', build.name)}-tuned-{build.target}"  # its own build folder and plan.json

    def rebase(p: Optional[str]) -> Optional[str]:
        if not p or p.startswith("embedded:") or Path(p).expanduser().is_absolute() or "/" not in p and \
                not p.startswith("."):
            return p
        return os.path.relpath((spec_path.parent / p).resolve(), out_path.parent.resolve())

    model = data.get("model") or {}
    for key in ("source", "hf_config"):
        if key in model:
            model[key] = rebase(model[key])
    a = best.prediction
    slo = result.slo
    calibrated = a.get("tokens_per_s_per_gpu_calibrated")
    head = [f"Written by `trtpipe tune {spec_path.name} --target {build.target} --isl {slo.isl} --osl {slo.osl} "
            f"--ttft-ms {slo.ttft_ms:g} --tpot-ms {slo.tpot_ms:g} --gpus {result.gpus} --max-ppl-delta-pct "
            f"{result.max_ppl_delta_pct:g}`.",
            f"Predicted (aiconfigurator {perf_model.AICONFIGURATOR_VERSION}, trtllm {a.get('backend_version')} "
            f"database, {a.get('database_mode', '').lower()}; a prediction, not a measurement): "
            f"TTFT {a['ttft_ms']:.0f} ms, TPOT {a['tpot_ms']:.1f} ms at {best.concurrency} in flight, "
            f"{a['tokens_per_s_per_gpu']:,.0f} output tok/s per GPU"
            + ("." if calibrated is None else f" ({calibrated:,.0f} calibrated, builders/perf_calibration.py)."),
            f"targets.{build.target} holds the choice; why each setting:"]
    head += [f"  {r}" for r in reasons(result)]
    text = "".join(f"# {line}\n" for line in head)
    first = spec_path.read_text().splitlines()[:1]
    if first and first[0].startswith("# yaml-language-server:"):  # editor completion, rebased like the paths
        schema = first[0].split("$schema=", 1)[-1].strip()
        text = f"# yaml-language-server: $schema={rebase(schema) or schema}\n" + text
    return text + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_build_file(spec_path: Path, out_path: Path, build: ResolvedBuild, target: TargetProfile, hf_config: dict,
                     result: TuneResult, *, force: bool = False) -> Plan:
    """Write the tuned build file (refusing to replace a file unless ``force``) and plan it: the plan is returned.

    Raises:
        SpecError: the file exists (without ``force``), or the written file does not plan cleanly (it is
            removed again).
    """
    from builders.spec import load_spec

    if out_path.exists() and not force:
        raise SpecError([Problem("--output", str(out_path), "exists", "pass --force to replace it, or another "
                                 "--output", code="output_exists")])
    text = tuned_build_file(spec_path, out_path, build, result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.parent / f".{out_path.name}.tmp-{os.getpid()}"
    tmp.write_text(text)
    try:
        tuned = load_spec(tmp, build.target)
        plan = preflight.make_plan(tuned, target, hf_config, isl=result.slo.isl, osl=result.slo.osl)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out_path)
    return plan


def default_output(spec_path: Path, target: str) -> Path:
    """``<build file folder>/<stem>.tuned-<target>.yaml`` (relative paths in the file stay valid)."""
    return spec_path.parent / f"{spec_path.stem}.tuned-{target}.yaml"


def library_default(build: ResolvedBuild, target: TargetProfile, hf_config: dict, slo: Slo, gpus: int) -> list[dict]:
    """aiconfigurator's own ``cli_default`` aggregated picks for the same model, system, GPUs and SLO (it
    sweeps the checkpoint's own precision: the 16-bit config.json)."""
    req = {"op": "default", "model_dir": str(perf_model.model_dir(hf_config)),
           "system": target.aiconfigurator_system, "backend": "trtllm", "total_gpus": gpus, "isl": slo.isl,
           "osl": slo.osl, "ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms}
    return perf_model.run_worker(req)[0].get("picks", [])


def _recipe_by_mode() -> dict[str, str]:
    out: dict[str, str] = {}
    for r in QUANT_RECIPES.values():
        for mode in (r.aiconfigurator_gemm, r.aiconfigurator_moe):
            if mode:
                out.setdefault(mode, r.name)
    return out


GEMM_TO_RECIPE = _recipe_by_mode()
"""aiconfigurator's quant mode to our recipe: the registry inverted (QuantRecipe.aiconfigurator_gemm, then
aiconfigurator_moe, whose ``fp8`` is also a GEMMQuantMode: FP8 without static activation scales);
the first recipe in QUANT_RECIPES wins a mode several share (int4_wo: int4_awq, not int4_rtn or int4_gptq)."""


def judge_pick(spec_path: Path, build: ResolvedBuild, target: TargetProfile, hf_config: dict, slo: Slo,
               pick: dict, max_ppl_delta_pct: Optional[float], accuracy: dict) -> str:
    """Whether our rules accept one of aiconfigurator's picks: "" or the rule that refuses it."""
    recipe = GEMM_TO_RECIPE.get(pick["gemm"])
    if recipe is None:
        return f"no recipe of ours runs GEMM mode {pick['gemm']}"
    delta = accuracy.get(recipe, (None, ""))[0]
    if max_ppl_delta_pct is not None and (delta is None or delta > max_ppl_delta_pct):
        return f"accuracy: {recipe} perplexity {'not measured' if delta is None else f'+{delta:.1f}%'}"
    kv = "fp8" if pick["kvcache"] == "fp8" else None
    c = Candidate(recipe, kv, pick["tp_size"], pick["pp_size"], None, pick["batch_size"], pick["ctx_tokens"],
                  KV_FRACTIONS[0])
    data = read_yaml(spec_path)
    bf = parse_build_file(data, str(spec_path))
    try:
        settings = resolve_target(bf, data, build.target, str(spec_path), c.overrides())
        preflight.make_plan(build.model_copy(update={"settings": settings}), target, hf_config, isl=slo.isl,
                            osl=slo.osl)
    except SpecError as e:
        p = e.problems[0]
        return f"{p.code}: {p.field} = {p.value!r}: {p.rule}"
    return ""

