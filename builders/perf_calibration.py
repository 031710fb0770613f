"""A correction of aiconfigurator's predicted output tokens/s, fitted to TensorRT-LLM's published throughput.

aiconfigurator 0.12.0 (builders/perf_model.py) composes measured kernel times into a steady-state step; against the
max-throughput table of TensorRT-LLM's ``docs/source/performance/perf-overview.md`` (NVIDIA/TensorRT-LLM commit
00f37686, ``trtllm-bench throughput``) it is off in two ways this module corrects, for dense models:

- **Pipeline parallelism**: aiconfigurator's throughput grows with pp_size in proportion (each stage holds its own
  batch and TPOT stays the same; measured on RTX Pro 6000 at pp 1-8), while the published runs lose more the more
  stages there are (Llama-3.3-70B FP4 at 128/128: 3,264 / 6,172 / 9,641 / 11,881 tok/s at pp 1 / 2 / 4 / 8).
- **A common efficiency**: at the KV capacity the plan computes (builders/plan.py, the batch the plan predicts at),
  aiconfigurator's tok/s is higher than published on average.

The correction is one factor on output tokens/s (``factor``)::

    calibrated tok/s = aiconfigurator tok/s x exp(c0 + c_pp x ln(pp_size))

with ``c0`` and ``c_pp`` fitted by least squares on ln(published / predicted) (:func:`fit`) and kept, with their
provenance and their leave-one-model-out error, in ``configs/perf_calibration.json``. TTFT and TPOT are not
corrected. It is fitted at maximum-throughput points (hundreds of sequences in flight); at low concurrency it is an
extrapolation.

Two regimes (:func:`regime`), each with its own constants: dense models (``dense``, fitted at the plan's KV
capacity), and mixture-of-experts models with attention DP (``moe_attention_dp``, the option the published MoE
runs set; fitted on aiconfigurator's best tokens/s over batch sizes, as the plan cannot size Llama 4's KV). MoE
without attention DP is left uncorrected (:func:`refusal`): no published run measures it
(docs/benchmarks/prediction.md).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional

if TYPE_CHECKING:
    from builders.plan import PerformancePrediction

CONSTANTS = Path(__file__).resolve().parents[1] / "configs" / "perf_calibration.json"
"""The fitted constants and their provenance (written by ``scripts/bench/bench_prediction.py --fit``)."""
LABEL = "calibrated"
"""How the corrected number is labelled beside aiconfigurator's in tables and plan.json."""


@dataclass(frozen=True)
class Calibration:
    """The fitted constants of :func:`factor` and where they come from."""

    c0: float
    """Common log-efficiency (dimensionless; exp(c0) is the factor at pp_size 1)."""
    c_pp: float
    """Log-efficiency per ln(pp_size) (dimensionless)."""
    source: str
    """What it was fitted on (file, commit, points) and by which command."""
    stated_error: str
    """Its leave-one-model-out error against the published numbers (docs/benchmarks/prediction.md)."""


def features(pp_size: int) -> list[float]:
    """The regressors of ln(published / predicted): [1, ln(pp_size)].

    Raises:
        ValueError: pp_size below 1.
    """
    if pp_size < 1:
        raise ValueError(f"pp_size must be >= 1, got {pp_size}")
    return [1.0, math.log(pp_size)]


def factor(cal: Calibration, pp_size: int) -> float:
    """The multiplier on aiconfigurator's output tokens/s: exp(c0 + c_pp x ln(pp_size)) (dimensionless)."""
    f0, f_pp = features(pp_size)
    return math.exp(cal.c0 * f0 + cal.c_pp * f_pp)


REGIMES = ("dense", "moe_attention_dp")
"""The fitted regimes: the top level of configs/perf_calibration.json is ``dense``; ``moe_attention_dp`` is its
own object there."""


def regime(is_moe: bool, attention_dp: bool = False) -> Optional[str]:
    """The regime whose constants apply: ``dense``, ``moe_attention_dp``, or None (MoE without attention DP)."""
    if not is_moe:
        return "dense"
    return "moe_attention_dp" if attention_dp else None


def refusal(is_moe: bool, attention_dp: bool = False) -> str:
    """Why the correction does not apply ("" when it does). One clause."""
    if regime(is_moe, attention_dp) is None:
        return ("not calibrated for mixture-of-experts models without attention DP: the published MoE runs set it "
                "(docs/benchmarks/prediction.md)")
    return ""


def load(path: Path = CONSTANTS, which: str = "dense") -> Calibration:
    """The constants of regime ``which`` in ``path`` (configs/perf_calibration.json).

    Raises:
        ValueError: the file is missing, not JSON, or lacks c0, c_pp, source or stated_error for ``which`` (the
            message names the file and the command that writes it); ``which`` not in :data:`REGIMES`.
    """
    if which not in REGIMES:
        raise ValueError(f"unknown calibration regime {which!r}; known: {REGIMES}")
    try:
        data = json.loads(Path(path).read_text())
        data = data if which == "dense" else data[which]
        return Calibration(c0=float(data["c0"]), c_pp=float(data["c_pp"]), source=str(data["source"]),
                           stated_error=str(data["stated_error"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a calibration file for {which} ({type(e).__name__}: {e}); write it with "
                         "python scripts/bench/bench_prediction.py --fit") from e


@functools.lru_cache(maxsize=8)
def _load_once(path: str, which: str) -> Calibration:
    """:func:`load`, once per path and regime per process (trtpipe tune asks for every candidate)."""
    return load(Path(path), which)


def factor_for(pp_size: int, is_moe: bool, path: Path = CONSTANTS, *, attention_dp: bool = False) -> Optional[float]:
    """:func:`factor` with the constants in ``path`` for the regime, or None where :func:`refusal` refuses or the
    file is unreadable (never raises on those; ValueError for pp_size < 1)."""
    which = regime(is_moe, attention_dp)
    if which is None:
        return None
    try:
        return factor(_load_once(str(path), which), pp_size)
    except ValueError:
        if pp_size < 1:
            raise
        return None


def apply(prediction: "PerformancePrediction", pp_size: int, is_moe: bool,
          path: Path = CONSTANTS, *, attention_dp: bool = False) -> "PerformancePrediction":
    """``prediction`` with its trtllm points' output tokens/s (total and per GPU) corrected beside aiconfigurator's.

    The calibrated numbers go in ``output_tokens_per_s_calibrated`` / ``output_tokens_per_s_per_gpu_calibrated``
    of each trtllm point (vLLM and SGLang are not calibrated: the published numbers are TensorRT-LLM's); the factor
    and its source, or why there is none, in ``calibration`` / ``calibration_factor``. Never raises: an unreadable
    constants file is reported in ``calibration``. A prediction without aiconfigurator's points (unavailable, or the
    roofline estimate) is returned unchanged.
    """
    if not prediction.available or prediction.method != "aiconfigurator":
        return prediction
    which = regime(is_moe, attention_dp)
    if which is None:
        return prediction.model_copy(update={"calibration": refusal(is_moe, attention_dp)})
    try:
        cal = load(path, which)
    except ValueError as e:
        return prediction.model_copy(update={"calibration": f"not calibrated: {e}"})
    f = factor(cal, pp_size)
    backends = []
    for b in prediction.backends:
        if b.backend == "trtllm":
            b = b.model_copy(update={"points": [p.model_copy(update={
                "output_tokens_per_s_calibrated": round(p.output_tokens_per_s * f, 1),
                "output_tokens_per_s_per_gpu_calibrated": round(p.output_tokens_per_s_per_gpu * f, 1)})
                for p in b.points]})
        backends.append(b)
    note = (f"{LABEL} = aiconfigurator x {f:.3f} (exp({cal.c0:+.4f} {cal.c_pp:+.4f} x ln pp {pp_size}), {which}); "
            f"fitted at maximum throughput, {cal.stated_error}")
    return prediction.model_copy(update={"backends": backends, "calibration": note, "calibration_factor": round(f, 4)})


def fit(rows: Iterable[dict]) -> tuple[float, float]:
    """Least-squares (c0, c_pp) of ln(published / predicted) on :func:`features`.

    Each row holds ``pp_size``, ``predicted`` and ``published`` (output tokens/s, > 0). A design without two
    distinct pp_size values determines c0 only; c_pp is then 0.

    Raises:
        ValueError: no rows, or a tokens/s that is not positive.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("no points to fit")
    xs, ys = [], []
    for r in rows:
        if r["predicted"] <= 0 or r["published"] <= 0:
            raise ValueError(f"tokens/s must be positive: {r}")
        xs.append(features(r["pp_size"]))
        ys.append(math.log(r["published"] / r["predicted"]))
    if len({x[1] for x in xs}) < 2:
        return sum(ys) / len(ys), 0.0
    import numpy as np

    (c0, c_pp), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
    return float(c0), float(c_pp)


def leave_one_model_out(rows: list[dict], key: Callable[[dict], str] = lambda r: r["model"]) -> list[dict]:
    """For each model, fit (:func:`fit`) on the other models' rows and correct this model's rows with it.

    Returns one dict per row, in order: ``calibrated`` (tokens/s), ``c0``, ``c_pp`` (the constants it was corrected
    with) and ``held_out`` (the model left out of that fit).

    Raises:
        ValueError: see :func:`fit` (e.g. only one model).
    """
    models = sorted({key(r) for r in rows})
    consts = {m: fit(r for r in rows if key(r) != m) for m in models}
    out = []
    for r in rows:
        c0, c_pp = consts[key(r)]
        f = factor(Calibration(c0=c0, c_pp=c_pp, source="", stated_error=""), r["pp_size"])
        out.append({"calibrated": r["predicted"] * f, "c0": c0, "c_pp": c_pp, "held_out": key(r)})
    return out


def error_summary(pairs: Iterable[tuple[float, float]]) -> dict:
    """Mean absolute and worst signed relative error (percent, 1 decimal) of (predicted, published) pairs.

    Raises:
        ValueError: no pairs.
    """
    errs = [p / q - 1 for p, q in pairs]
    if not errs:
        raise ValueError("no points")
    worst = max(errs, key=abs)
    return {"points": len(errs), "mae_pct": round(100 * sum(map(abs, errs)) / len(errs), 1),
            "worst_pct": round(100 * worst, 1)}


def at_capacity(grid: list[tuple[int, float]], capacity: int) -> Optional[float]:
    """Output tokens/s at ``capacity`` sequences in flight, from aiconfigurator's answers on a batch grid.

    ``grid``: (batch_size, tokens/s) pairs aiconfigurator answered. The best answer at a batch within ``capacity``,
    or, where ``capacity`` falls between two grid batches, the log-log interpolation between them when higher; past
    the last answered batch, its last segment extended with a slope clipped to [0, 1] (throughput grows at most in
    proportion to the batch). None when nothing is answered or ``capacity`` < 1.
    """
    g = sorted((b, t) for b, t in grid if t > 0)
    if not g or capacity < 1:
        return None
    inside = [t for b, t in g if b <= capacity]
    lo = [x for x in g if x[0] <= capacity]
    hi = [x for x in g if x[0] > capacity]
    if lo and hi:
        (b0, t0), (b1, t1) = lo[-1], hi[0]
        v = t0 * (capacity / b0) ** (math.log(t1 / t0) / math.log(b1 / b0))
    elif len(lo) >= 2:
        (b0, t0), (b1, t1) = lo[-2], lo[-1]
        v = t1 * (capacity / b1) ** min(1.0, max(0.0, math.log(t1 / t0) / math.log(b1 / b0)))
    elif lo:
        v = lo[-1][1]
    else:
        b0, t0 = hi[0]
        v = t0 * capacity / b0
    return max(max(inside, default=0.0), v)
