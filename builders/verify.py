"""Verify a checkpoint against its source model before any GPU time is spent.

The checkpoint (TensorRT-LLM rank shards merged, or ModelOpt's unified HF export) is dequantized back
into the source architecture (:func:`builders.checkpoint.read_checkpoint`), and both models score the same
held-out text
(the ``evaluation`` split of :mod:`builders.calibration`, never seen by calibration):

- ``perplexity`` of each model (next-token NLL over every position but the last of each window);
- ``top1_agreement``: share of positions whose argmax token is the same;
- ``mean_kl``: mean KL(source || quantized) in nats per token;
- ``max_logit_error``: largest absolute logit difference.

What this measures is the *weight* error of the checkpoint (what the ``pytorch`` runtime
serves): activation and KV-cache quantization (FP8/INT8 activation scales, FP8 KV cache) only
act inside a TensorRT-LLM engine and are not simulated here.

The gates (``gates.max_perplexity_delta_pct``, ``gates.min_top1_agreement``,
``gates.max_mean_kl``) turn the numbers into a pass/fail verdict: :func:`check_gates` raises
:class:`GateError` naming every exceeded field, its measured value and its threshold.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from plugins.errors import StageError


@dataclass(frozen=True)
class Gate:
    """One threshold: the YAML field, the metric it reads and the direction that passes."""

    field: str
    metric: str
    higher_is_better: bool


GATES: tuple[Gate, ...] = (
    Gate("max_perplexity_delta_pct", "perplexity_delta_pct", False),
    Gate("min_top1_agreement", "top1_agreement", True),
    Gate("max_mean_kl", "mean_kl", False),
)


class GateError(StageError):
    """A quality gate failed; ``report`` holds every measured number."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def load_checkpoint_model(ckpt_dir: Path, hf_dir: Path, *, trust_remote_code: bool = False):
    """The source architecture with the checkpoint's dequantized weights (either format), float32.

    The weights are written as an HF folder in a temporary directory and loaded with ``from_pretrained``, so
    the library maps the checkpoint's names (MoE experts one by one, fused Phi-3 projections) onto the model
    exactly as it does the source's (with ``trust_remote_code``, ``model.trust_remote_code``: the source's own
    model class where its config.json names one).

    Raises:
        StageError: the checkpoint's tensors do not map onto the source architecture.
    """
    import tempfile

    from transformers import AutoModelForCausalLM

    from builders.checkpoint import write_dequantized

    with tempfile.TemporaryDirectory(prefix="trtpipe-verify-") as tmp:
        info, tied = write_dequantized(ckpt_dir, Path(hf_dir), Path(tmp), torch.float32)
        model, loading = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True,
                                                              trust_remote_code=trust_remote_code)
    missing = [k for k in loading.get("missing_keys", ()) if not (tied and k == "lm_head.weight")]
    unexpected = list(loading.get("unexpected_keys", ()))
    if missing or unexpected or loading.get("mismatched_keys"):
        raise StageError(f"{ckpt_dir} does not map onto {type(model).__name__} from {hf_dir}: missing "
                         f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}, mismatched "
                         f"{list(loading.get('mismatched_keys') or [])[:5]}")
    return model.eval(), info


@torch.no_grad()
def compare_models(source, candidate, windows: list[list[int]]) -> dict:
    """Score ``candidate`` against ``source`` on token windows (one forward per window and model); ``source`` None:
    the candidate's own perplexity only (``perplexity``, ``positions``, ``nonfinite_logits``)."""
    nll_s = nll_c = kl = 0.0
    agree = positions = nonfinite = 0
    max_err = 0.0
    for ids in windows:
        x = torch.tensor([ids])
        lc = candidate(x).logits[0, :-1].float()
        nonfinite += int((~torch.isfinite(lc)).sum().item())  # inf/NaN weights (an fp16 overflow) end here
        target = x[0, 1:]
        lpc = lc.log_softmax(-1)
        nll_c -= lpc.gather(-1, target[:, None]).sum().item()
        positions += target.numel()
        if source is None:
            continue
        ls = source(x).logits[0, :-1].float()
        lps = ls.log_softmax(-1)
        nll_s -= lps.gather(-1, target[:, None]).sum().item()
        kl += (lps.exp() * (lps - lpc)).sum().item()
        agree += (ls.argmax(-1) == lc.argmax(-1)).sum().item()
        max_err = max(max_err, (ls - lc).abs().max().item())
    if source is None:
        return {"perplexity": math.exp(nll_c / positions), "positions": positions, "nonfinite_logits": nonfinite}
    ppl_s, ppl_c = math.exp(nll_s / positions), math.exp(nll_c / positions)
    mean_kl = kl / positions
    return {"source_perplexity": ppl_s, "perplexity": ppl_c,
            "perplexity_delta_pct": 100.0 * (ppl_c - ppl_s) / ppl_s,
            # argmax over NaN logits picks an index anyway: agreement counts only where the candidate is finite
            "top1_agreement": agree / positions if not nonfinite else 0.0,
            "mean_kl": mean_kl if not math.isfinite(mean_kl) else max(0.0, mean_kl),  # max() would hide a NaN
            "max_logit_error": max_err, "positions": positions, "nonfinite_logits": nonfinite}


def check_gates(metrics: dict, gates) -> list[dict]:
    """Every gate with its threshold, measured value and verdict (thresholds left null are skipped).

    One check always runs, whatever the gates: the candidate's logits are finite (``nonfinite_logits`` 0) and every
    metric is a number. A checkpoint with inf/NaN weights gives NaN perplexity, and NaN compares false with any
    threshold, so no threshold gate alone can be trusted to fail it.
    """
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    n = int(metrics.get("nonfinite_logits", 0))
    out = [{"field": "finite", "metric": "nonfinite_logits", "value": n, "threshold": 0,
            "passed": n == 0 and not bad, "nonfinite_metrics": bad}]
    for g in GATES:
        threshold = getattr(gates, g.field)
        if threshold is None or g.metric not in metrics:  # no reference: nothing to compare with
            continue
        value = metrics[g.metric]
        ok = math.isfinite(value) and (value >= threshold if g.higher_is_better else value <= threshold)
        out.append({"field": f"gates.{g.field}", "metric": g.metric, "value": value, "threshold": threshold,
                    "passed": bool(ok)})
    return out


@torch.no_grad()
def compare_adapters(source, candidate, adapters: list, windows: list[list[int]], gates) -> dict:
    """Score each LoRA adapter as served against its reference: ``candidate`` (the dequantized checkpoint) with the
    adapter applied unmerged, as the runtimes apply it, against ``source`` (the float32 base) with the adapter merged
    into its weights (PEFT's ``merge_adapter``). Same metrics (:func:`compare_models`) and gates as the base.

    Args:
        adapters: builders.lora.Adapter list (PEFT folders).
    Returns:
        ``{name: {"task_id", "metrics", "gates", "passed"}}``.
    """
    import copy

    from peft import PeftModel

    out = {}
    for a in adapters:
        reference = PeftModel.from_pretrained(copy.deepcopy(source), str(a.path)).eval()
        reference.merge_adapter()
        served = PeftModel.from_pretrained(candidate, str(a.path)).eval()
        try:
            metrics = compare_models(reference, served, windows)
        finally:
            candidate = served.unload()  # the checkpoint's own layers back, for the next adapter
        del reference
        checks = check_gates(metrics, gates)
        out[a.name] = {"task_id": a.task_id, "metrics": metrics, "gates": checks,
                       "passed": all(c["passed"] for c in checks)}
    return out


NO_REFERENCE = "no reference: model.source is pre-quantized and model.reference is not set, so its quality is not " \
               "compared with an unquantized model (only its own perplexity is measured)"


def verify_checkpoint(ckpt_dir: Path, hf_dir: Path, gates, *, dataset: str = "pydoc_topics",
                      out_json: Path | None = None, trust_remote_code: bool = False,
                      adapters: list | None = None, reference: Path | None | str = "source") -> dict:
    """Measure the checkpoint against its source on held-out text and apply ``gates``.

    Args:
        ckpt_dir: TensorRT-LLM checkpoint, unified HF checkpoint, or pre-quantized source folder.
        hf_dir: the source Hugging Face folder (model and tokenizer).
        reference: the unquantized model scored against (``"source"``: ``hf_dir``; a folder: ``model.reference`` of
            a pre-quantized source; None: none, so only the checkpoint's own perplexity and finiteness are measured
            and the report's ``reference`` says so).
        gates: a :class:`builders.spec.QualityGate` (thresholds, ``eval_samples``, ``eval_seq_len``).
        dataset: evaluation corpus (its held-out ``evaluation`` split is used).
        out_json: where to write the report (written before the verdict, so a failure has it too).
        trust_remote_code: ``model.trust_remote_code``, for every load (tokenizer, source, checkpoint).
        adapters: the build's LoRA adapters (builders.lora.Adapter), each scored by :func:`compare_adapters`.

    Returns:
        the report: metrics, gates, evaluation settings and timings; ``adapters``: each adapter's metrics and gates.

    Raises:
        GateError: one or more gates failed (the message lists field, value and threshold of each).
        StageError: the checkpoint does not map onto the source architecture, or the source loaded with tensors
            missing (whatever the gates: builders.source_tensors.refuse_missing).
    """
    from transformers import AutoTokenizer

    from builders.calibration import token_windows
    from builders.source_tensors import load_source_model

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(hf_dir), trust_remote_code=trust_remote_code)
    windows = token_windows(tok, "evaluation", gates.eval_samples, gates.eval_seq_len, seed=0, dataset=dataset)
    # whatever the gates: a source loaded with missing keys has random weights, and the checkpoint made from it
    # scores well against it (both carry the same noise only by luck, or not at all): refused, named
    ref_dir = Path(hf_dir) if reference == "source" else (Path(reference) if reference is not None else None)
    source = None if ref_dir is None else load_source_model(ref_dir, torch.float32, trust_remote_code=trust_remote_code,
                                                            stage="verify").eval()
    candidate, info = load_checkpoint_model(Path(ckpt_dir), Path(hf_dir), trust_remote_code=trust_remote_code)
    t_load = time.perf_counter() - t0
    metrics = compare_models(source, candidate, windows)
    checks = check_gates(metrics, gates)
    scored = compare_adapters(source, candidate, adapters, windows, gates) if adapters and source is not None else {}
    report = {"reference": str(ref_dir) if ref_dir is not None else None,
              "compared_with": "source" if reference == "source" else ("model.reference" if ref_dir else None),
              **({"note": NO_REFERENCE} if ref_dir is None else {}),
              "quant_algo": info.quant_algo,
              "kv_cache_quant_algo": info.kv_cache_quant_algo, "checkpoint_format": info.format,
              "mapping": {"tp_size": info.tp_size, "pp_size": info.pp_size},
              "evaluation": {"dataset": dataset, "split": "evaluation", "samples": gates.eval_samples,
                             "seq_len": gates.eval_seq_len},
              "metrics": metrics, "gates": checks,
              "passed": all(c["passed"] for c in checks) and all(r["passed"] for r in scored.values()),
              **({"adapters": scored} if scored else {}),
              "load_s": round(t_load, 3), "eval_s": round(time.perf_counter() - t0 - t_load, 3)}
    if out_json is not None:
        Path(out_json).write_text(json.dumps(report, indent=2) + "\n")
    failed = [c for c in checks if not c["passed"]]
    bad_adapters = {name: r for name, r in scored.items() if not r["passed"]}
    if bad_adapters and not failed:
        lines = "; ".join(f"adapter {name!r} {c['field']}: measured {c['value']:.6g}, threshold {c['threshold']:.6g}"
                          for name, r in bad_adapters.items() for c in r["gates"] if not c["passed"])
        raise GateError(f"quality gate failed for LoRA adapter(s) on the {info.quant_algo or 'unquantized'} "
                        f"checkpoint {ckpt_dir}: {lines} (each adapter on the quantized base against the float base "
                        "merged with it). Fix: pick a more accurate quant_algo, or relax the gate in the build YAML",
                        report)
    if failed:
        lines = "; ".join(f"{c['field']}: measured {c['value']:.6g}, threshold {c['threshold']:.6g}"
                          + (f" (non-finite: {', '.join(c['nonfinite_metrics'])}; the checkpoint holds inf/NaN "
                             "values, e.g. an fp16 overflow: quantize from bfloat16/float32)"
                             if c["field"] == "finite" else "") for c in failed)
        raise GateError(f"quality gate failed for {info.quant_algo or 'unquantized'} checkpoint {ckpt_dir}: {lines} "
                        + (f"(perplexity {metrics['perplexity']:.4g} vs source {metrics['source_perplexity']:.4g}, "
                           f"top-1 agreement {metrics['top1_agreement']:.4f}, mean KL {metrics['mean_kl']:.4g} nats). "
                           if source is not None else f"(perplexity {metrics['perplexity']:.4g}, no reference). ")
                        + "Fix: pick a more accurate quant_algo, more calibration data, or relax the gate in the "
                        "build YAML", report)
    return report


def format_table(report: dict) -> str:
    """A plain-text table of a verify report (for the CLI)."""
    m = report["metrics"]
    if "source_perplexity" not in m:  # a pre-quantized source without model.reference
        rows = [("reference", "none (set model.reference to compare)"), ("perplexity", f"{m['perplexity']:.4f}"),
                ("positions", str(m["positions"]))]
    else:
        label = "reference" if report.get("compared_with") == "model.reference" else "source"
        rows = [(f"{label} perplexity", f"{m['source_perplexity']:.4f}"), ("perplexity", f"{m['perplexity']:.4f}"),
                ("perplexity delta %", f"{m['perplexity_delta_pct']:+.3f}"),
                ("top-1 agreement", f"{m['top1_agreement']:.4f}"), ("mean KL (nats/token)", f"{m['mean_kl']:.5f}"),
                ("max logit error", f"{m['max_logit_error']:.4f}"), ("positions", str(m["positions"]))]
    for c in report["gates"]:
        rows.append((c["field"], f"{c['value']:.5g} vs {c['threshold']:.5g}  {'PASS' if c['passed'] else 'FAIL'}"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
