"""A first-principles speed estimate of a plan, for targets aiconfigurator has no database for: the roofline.

Every engine step of aggregated in-flight batching reads the rank's weights once and the KV cache of every
sequence it extends, and does ~2 FLOPs per parameter per token; it takes whichever is longer, moving those bytes at
the target's memory bandwidth or doing those FLOPs at its tensor-core peak for the recipe's math precision (the
roofline model: S. Williams, A. Waterman, D. Patterson, "Roofline: an insightful visual performance model for
multicore architectures", CACM 52(4), 2009). Decode is bandwidth-bound at small batches because every step reads
all weights for one token per sequence (NVIDIA, "Mastering LLM Techniques: Inference Optimization", 2023); prefill
is compute-bound. Units: bytes, FLOPs, seconds inside; milliseconds and tokens/s in the points, as aiconfigurator's.

Per rank (tp x pp ranks; pipeline stages run one after another, no micro-batching, and tensor-parallel all-reduces
are not counted: both make the estimate optimistic for tp > 1 and pessimistic for pp > 1), from the plan's numbers:

- ``W`` bytes read per step: ``memory.weights_bytes_per_rank`` less the embedding table when an lm_head is held
  beside it (a lookup reads a few rows, not the table); quantization scales included.
- ``kv`` bytes per token: ``memory.kv.bytes_per_token``.
- ``F`` FLOPs per token through the matmuls: 2 x (``memory.params_active`` less the embedding when untied) / (tp x pp);
  attention adds ``A`` = 4 x layers/pp x heads/tp x head_dim FLOPs per token attended (QK^T and PV).
- bandwidth ``BW`` = ``memory_bandwidth_gbps`` and peak ``P`` = ``tensor_tflops`` of the math precision
  (:func:`precision`), each times its efficiency (:data:`EFFICIENCY`).

A step with ``n`` prompts of ISL tokens and ``m`` decoding sequences at mean context ``L = ISL + OSL/2``::

    bytes = k x W + n x ISL x kv + m x (L + 1) x kv          k = ceil(n x ISL / max_num_tokens) chunks
    flops = n x (ISL x F + A x ISL^2 / 2) + m x (F + A x L)
    t     = pp x max(bytes / (eff_bw x BW), flops / (eff_compute x P))

At concurrency ``c`` (a closed loop: a request is sent when one finishes; with fixed lengths they finish and
arrive in groups, as aiconfigurator also assumes), a context step holds ``n = min(c, max_num_tokens // ISL)`` prompts
(at least 1) beside the ``c - n`` others' decodes; each slot turns over once per request, so over a request's
OSL - 1 decode steps the engine runs ``c / n`` such steps and decode-only steps of ``c`` otherwise::

    TTFT     = t(0, c - n) [the step in flight; 0 when c <= n] + t(n, c - n)
    TPOT     = (c/n x t(n, c - n) + max(0, OSL - 1 - c/n) x t(0, c)) / (OSL - 1)
    latency  = TTFT + (OSL - 1) x TPOT
    tok/s    = c x OSL / latency (Little's law); per GPU / (tp x pp); per user 1000 / TPOT

TTFT counts no queue beyond the step in flight (aiconfigurator multiplies its context step by an empirical 1.9-4).
Not counted: speculative decoding, LoRA, MoE routing (every expert's weights are read each step, as at large
batches), the CPU-side scheduler, sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from builders.plan import BackendPrediction, PerformancePrediction, Plan, PredictedPoint
from plugins.recipes import QuantRecipe, recipe
from plugins.targets import TargetProfile

LABEL = "first-principles estimate (roofline, not aiconfigurator)"
EFFICIENCY = (0.73, 0.65)
"""Achievable fractions of (peak memory bandwidth, peak tensor throughput), fitted once: the pair, on a 0.01 grid,
that minimises the squared log error of TPOT and output tok/s against aiconfigurator 0.12.0's measured-kernel answers
(database mode SILICON, TensorRT-LLM 1.3.0rc20) for Llama-3-8B planned by configs/builds/llama-3-8b.yaml on l40s and
h100 (recipes none and fp8; ISL/OSL 128/128, 1000/1000 and 2048/256; the plan's concurrencies 1, 4, 16, 64: 48
points), by ``python scripts/bench/bench_roofline.py --fit`` (docs/benchmarks/prediction.md, roofline.json). TTFT is
not fitted: aiconfigurator's multiplies its context step by an empirical queuing factor of 1.9 to 4."""
ERROR_PCT = {"tpot_ms": (10, 32), "output_tokens_per_s": (9, 28), "ttft_ms": (56, -75)}
"""(median absolute, worst signed) error in % of the estimate against those 48 answers, per metric, the worst rounded
away from zero (docs/benchmarks/roofline.json, ``summary``, row ``all`` / ``SILICON answers``)."""
STATED_ERROR = ("against aiconfigurator 0.12.0's measured kernels (Llama-3-8B, l40s and h100, BF16 and FP8, 48 "
                f"points): TPOT median {ERROR_PCT['tpot_ms'][0]}% (worst {ERROR_PCT['tpot_ms'][1]:+}%), output tok/s "
                f"median {ERROR_PCT['output_tokens_per_s'][0]}% (worst {ERROR_PCT['output_tokens_per_s'][1]:+}%), "
                f"TTFT median {ERROR_PCT['ttft_ms'][0]}% lower (worst {ERROR_PCT['ttft_ms'][1]:+}%: aiconfigurator "
                "multiplies its context step by a queuing factor of 1.9-4, this counts the step in flight and the "
                "prompt's own); not checked on this GPU (docs/benchmarks/prediction.md)")
"""The estimate's error as the plan states it (PerformancePrediction.stated_error)."""


def precision(rec: QuantRecipe) -> str:
    """The tensor-core precision a recipe's GEMMs run in: a key of plugins.targets.TensorThroughput.

    Weight-only INT4 (int4_awq, int4_rtn, int4_gptq) dequantizes to 16-bit before the MMA, so it runs at fp16."""
    if rec.fp4_compute:
        return "fp4"
    if rec.fp8_compute:
        return "fp8"
    if rec.smoothquant:
        return "int8"
    return "fp16"


@dataclass(frozen=True)
class Inputs:
    """What one step of the plan's rank costs (units in the names; see the module docstring)."""

    bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    precision: str
    weight_bytes_per_step: int
    kv_bytes_per_token: int
    matmul_flops_per_token: float
    attention_flops_per_token_attended: float
    tp: int
    pp: int
    isl: int
    osl: int
    max_num_tokens: int

    def step_s(self, prompts: int, decodes: int, efficiency: tuple[float, float] = EFFICIENCY) -> float:
        """Seconds of one step holding ``prompts`` prompts of ISL tokens and ``decodes`` decoding sequences."""
        isl, ctx = self.isl, self.isl + self.osl / 2
        chunks = max(1, math.ceil(prompts * isl / self.max_num_tokens))
        moved = (chunks * self.weight_bytes_per_step + prompts * isl * self.kv_bytes_per_token
                 + decodes * (ctx + 1) * self.kv_bytes_per_token)
        flops = (prompts * (isl * self.matmul_flops_per_token + self.attention_flops_per_token_attended * isl ** 2 / 2)
                 + decodes * (self.matmul_flops_per_token + self.attention_flops_per_token_attended * ctx))
        return self.pp * max(moved / (efficiency[0] * self.bandwidth_bytes_per_s),
                             flops / (efficiency[1] * self.peak_flops_per_s))

    def prompts_per_step(self, c: int) -> int:
        """``n``: the prompts one context step holds at ``c`` in flight (max_num_tokens // ISL, at least 1)."""
        return min(c, max(1, self.max_num_tokens // self.isl))

    def point(self, c: int, efficiency: tuple[float, float] = EFFICIENCY) -> PredictedPoint:
        """The estimate at ``c`` requests in flight (formulas in the module docstring)."""
        n = self.prompts_per_step(c)
        mixed, decode = self.step_s(n, c - n, efficiency), self.step_s(0, c, efficiency)
        ttft = (self.step_s(0, c - n, efficiency) if c > n else 0.0) + mixed
        gen = self.osl - 1
        tpot = (c / n * mixed + max(0.0, gen - c / n) * decode) / gen if gen > 0 else 0.0
        latency = ttft + gen * tpot
        tps = c * self.osl / latency
        return PredictedPoint(concurrency=c, ttft_ms=1000 * ttft, tpot_ms=1000 * tpot,
                              request_latency_ms=1000 * latency, output_tokens_per_s=tps,
                              output_tokens_per_s_per_gpu=tps / (self.tp * self.pp),
                              output_tokens_per_s_per_user=1 / tpot if tpot else 0.0)


def refusal(plan: Plan, target: TargetProfile) -> str:
    """Why there is no estimate ("" when there is one). One clause."""
    if target.kind != "gpu" or target.tensor_tflops is None:
        return f"target {target.name} states no tensor throughput (tensor_tflops in configs/targets/)"
    prec = precision(recipe(plan.quant_algo))
    if getattr(target.tensor_tflops, prec) is None:
        return f"target {target.name} has no {prec} tensor cores for quant_algo {plan.quant_algo}"
    if plan.memory.kv.workload_concurrency < 1:
        return "the KV pool holds no sequence of the plan's ISL+OSL"
    if plan.attention_dp_size > 1:
        return "the estimate does not model attention DP (parallelism.enable_attention_dp)"
    return ""


def inputs(plan: Plan, target: TargetProfile) -> Inputs:
    """The step costs of the plan's heaviest rank on ``target`` (the plan's bytes and parameters, not recomputed)."""
    m, shape = plan.memory, plan.model
    tp, pp = plan.serving_tp, plan.serving_pp
    parts = m.weights_breakdown
    gathered = parts.get("embedding", 0) if parts.get("lm_head", 0) else 0  # untied: the table is only looked up
    untied = 0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size
    prec = precision(recipe(plan.quant_algo))
    return Inputs(bandwidth_bytes_per_s=target.memory_bandwidth_gbps * 1e9,
                  peak_flops_per_s=getattr(target.tensor_tflops, prec) * 1e12, precision=prec,
                  weight_bytes_per_step=m.weights_bytes_per_rank - gathered,
                  kv_bytes_per_token=m.kv.bytes_per_token,
                  matmul_flops_per_token=2 * (m.params_active - untied) / (tp * pp),
                  attention_flops_per_token_attended=4 * shape.num_hidden_layers / pp
                  * math.ceil(shape.num_attention_heads / tp) * shape.head_dim,
                  tp=tp, pp=pp, isl=m.kv.workload_isl, osl=m.kv.workload_osl,
                  max_num_tokens=plan.limits.max_num_tokens)


def predict_plan(plan: Plan, target: TargetProfile, concurrencies: list[int], why_not_aiconfigurator: str,
                 backend: str = "trtllm") -> PerformancePrediction:
    """The estimate at each of ``concurrencies``, labelled as such, with the reason aiconfigurator did not answer."""
    why = refusal(plan, target)
    if why:
        return PerformancePrediction(available=False, reason=f"{why_not_aiconfigurator}; no {LABEL}: {why}")
    inp = inputs(plan, target)
    return PerformancePrediction(
        available=True, method="roofline", reason=why_not_aiconfigurator, source=LABEL, stated_error=STATED_ERROR,
        system=target.name, isl=inp.isl, osl=inp.osl,
        inputs={"precision": inp.precision, "memory_bandwidth_gbps": target.memory_bandwidth_gbps,
                "tensor_tflops": inp.peak_flops_per_s / 1e12, "efficiency_bandwidth": EFFICIENCY[0],
                "efficiency_compute": EFFICIENCY[1], "weight_bytes_per_step": inp.weight_bytes_per_step,
                "kv_bytes_per_token": inp.kv_bytes_per_token, "tp_size": inp.tp, "pp_size": inp.pp,
                "max_num_tokens": inp.max_num_tokens},
        backends=[BackendPrediction(backend=backend, points=[inp.point(c) for c in concurrencies])])
