"""Quantization benchmark: every recipe on SmolLM2-135M, scored against the source model.

For each quantization: ModelOpt quantize + export (tp=1, pp=1) in a fresh subprocess (so its
peak RSS is its own), then :func:`builders.verify.verify_checkpoint` on held-out text.
A second table exports a small random Llama whose head counts divide 2 and 4 (SmolLM2 has 9
heads, so the planner refuses tp=2 for it) at tp=1/2/4 and checks the shards read back to
the same weights. Writes ``docs/benchmarks/quantization.md`` and ``quantization.json``.

Usage:
    TRTPIPE_CACHE=... python scripts/bench/bench_quantization.py [--quants none,fp8,...] [--calib 16x256] [--eval 8x256]

The markdown keeps everything from ``## Appendix: earlier runs`` on (:func:`appendix`) and rewrites the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # scripts/bench
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

QUANTS = ["none", "fp8", "int4_rtn", "int4_awq", "int4_gptq", "w4a8_awq", "int8_sq"]
GROUP = 64  # SmolLM2's hidden 576 is not a multiple of 128


def _dims(text: str) -> tuple[int, int]:
    n, s = text.lower().split("x")
    return int(n), int(s)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def run_one(quant: str, hf_dir: Path, out: Path, calib: tuple[int, int], tp: int = 1, pp: int = 1) -> dict:
    """Quantize + export one checkpoint (called in a subprocess); returns timings and peak RSS."""
    from transformers import AutoTokenizer

    from builders.calibration import token_windows
    from builders.quantize import needs_calibration, quantize_to_checkpoint
    from plugins.fsutil import measure

    samples = []
    if needs_calibration(quant, None):
        tok = AutoTokenizer.from_pretrained(str(hf_dir))
        samples = token_windows(tok, "calibration", calib[0], calib[1], seed=1234)
    with measure("quantize") as t:
        info = quantize_to_checkpoint(hf_dir, out, quant_algo=quant, group_size=GROUP, kv_cache_quant_algo=None,
                                      dtype="float16", tp_size=tp, pp_size=pp, decoder_type="llama",
                                      calib_samples=samples)
    return {**info, "quantize_wall_s": round(t.wall_s, 2), "quantize_peak_rss_mib": round(t.peak_rss_bytes / 2**20)}


def _subprocess(quant, hf_dir, out, calib, tp=1) -> dict:
    code = (f"import json,sys; sys.path.insert(0, {str(HERE)!r}); from pathlib import Path; "
            f"from bench_quantization import run_one; "
            f"print('RESULT' + json.dumps(run_one({quant!r}, Path({str(hf_dir)!r}), Path({str(out)!r}), "
            f"{tuple(calib)!r}, tp={tp})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{quant}: {proc.stderr[-2000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def small_llama(folder: Path, tokenizer_dir: Path) -> Path:
    """A seeded random Llama (8 heads, 4 KV heads) with SmolLM2's tokenizer, for tp=2/4 shards."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from builders.model_fetch import copy_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=49152, max_position_embeddings=1024, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    copy_tokenizer(tokenizer_dir, folder)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quants", default=",".join(QUANTS))
    ap.add_argument("--calib", default="16x256", help="calibration samples x tokens (default 16x256)")
    ap.add_argument("--eval", default="8x256", help="held-out evaluation samples x tokens (default 8x256)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of other quantizations already in quantization.json (re-measure only --quants)")
    ap.add_argument("--skip-tp", action="store_true", help="skip the tensor-parallel table (keep the stored one)")
    args = ap.parse_args()
    import torch

    from builders.checkpoint import to_hf_state_dict
    from builders.model_fetch import resolve_source
    from builders.verify import verify_checkpoint
    from builders.spec import QualityGate

    calib, ev = _dims(args.calib), _dims(args.eval)
    gates = QualityGate(eval_samples=ev[0], eval_seq_len=ev[1])
    hf_dir = resolve_source("embedded:smollm2-135m-instruct")
    rows, tp_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for quant in args.quants.split(","):
            out = tmp / quant
            load_before = os.getloadavg()[0]
            q = _subprocess(quant, hf_dir, out, calib)
            load_after = os.getloadavg()[0]
            rep = verify_checkpoint(out, hf_dir, gates)
            rows.append({"quant": quant, "quant_algo": rep["quant_algo"], **rep["metrics"],
                         "checkpoint_bytes": _bytes(out), **{k: q[k] for k in (
                             "calibration_s", "export_s", "quantize_wall_s", "quantize_peak_rss_mib",
                             "calibration_samples")},
                         # 1-minute load average around the quantize run: timings from a busy 2-core
                         # machine are inflated, and the table says so.
                         "loadavg_1m": round(max(load_before, load_after), 2)})
            print(json.dumps(rows[-1]), flush=True)
        small = small_llama(tmp / "small-llama", hf_dir)
        for quant in () if args.skip_tp else ("none", "fp8", "int4_awq"):
            ref = None
            for tp in (1, 2, 4):
                out = tmp / f"small-{quant}-tp{tp}"
                q = _subprocess(quant, small, out, (4, 64), tp=tp)
                sd, _ = to_hf_state_dict(out, vocab_size=49152)
                ref = sd if ref is None else ref
                same = all(torch.equal(sd[k], ref[k]) for k in ref)
                rep = verify_checkpoint(out, small, gates)
                tp_rows.append({"quant": quant, "tp_size": tp, "ranks": len(list(out.glob("rank*.safetensors"))),
                                "checkpoint_bytes": _bytes(out), "same_weights_as_tp1": same,
                                "mean_kl": rep["metrics"]["mean_kl"],
                                "top1_agreement": rep["metrics"]["top1_agreement"],
                                "quantize_wall_s": q["quantize_wall_s"]})
                print(json.dumps(tp_rows[-1]), flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), platform.processor())
    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(),
            "command": "TRTPIPE_CACHE=... python scripts/bench/bench_quantization.py " + " ".join(sys.argv[1:]),
            "model": "SmolLM2-135M-Instruct (embedded:smollm2-135m-instruct)", "group_size": GROUP,
            "calibration": {"dataset": "pydoc_topics (first 80%)", "samples": calib[0], "seq_len": calib[1],
                            "seed": 1234},
            "evaluation": {"dataset": "pydoc_topics (last 20%, held out)", "samples": ev[0], "seq_len": ev[1]}}
    args.out.mkdir(parents=True, exist_ok=True)
    old_path = args.out / "quantization.json"
    if (args.append or args.skip_tp) and old_path.is_file():
        old = json.loads(old_path.read_text())
        if args.append:
            mine = {r["quant"] for r in rows}
            order = {q: i for i, q in enumerate(QUANTS)}
            rows = sorted([r for r in old["smollm2"] if r["quant"] not in mine] + rows,
                          key=lambda r: order.get(r["quant"], 99))
        if args.skip_tp:
            tp_rows = old["tp"]
    (args.out / "quantization.json").write_text(json.dumps({"meta": meta, "smollm2": rows, "tp": tp_rows},
                                                           indent=2) + "\n")
    md = args.out / "quantization.md"
    md.write_text(render(meta, rows, tp_rows, appendix(md.read_text()) if md.is_file() else ""))
    print(f"wrote {args.out / 'quantization.md'}")
    return 0


APPENDIX = "## Appendix: earlier runs"


def appendix(markdown: str) -> str:
    """The earlier runs kept at the end of quantization.md (from :data:`APPENDIX` on; move the current table there
    by hand before a run whose numbers should be kept): every run rewrites the rest."""
    at = markdown.find(APPENDIX)
    return markdown[at:] if at >= 0 else ""


def render(meta: dict, rows: list[dict], tp_rows: list[dict], earlier: str = "") -> str:
    c, e = meta["calibration"], meta["evaluation"]
    lines = [
        "# Quantization benchmark (SmolLM2-135M, CPU)", "",
        f"- date: {meta['date']}; hardware: {meta['cores']} cores {meta['cpu']}, no GPU",
        f"- command: `{meta['command']}`",
        f"- calibration: {c['samples']} x {c['seq_len']} tokens of {c['dataset']}, seed {c['seed']}; "
        f"INT4 group size {meta['group_size']}; tp=1, pp=1, fp16 checkpoint",
        f"- evaluation: {e['samples']} x {e['seq_len']} tokens of {e['dataset']}; the source is the float32 HF model",
        "- metrics compare the checkpoint's dequantized weights with the source (`trtpipe verify`): activation "
        "and KV-cache quantization act only inside a TensorRT-LLM engine and are not simulated here, so fp8 and "
        "int8_sq rows show their weight error only.",
        "- int4_rtn and int4_gptq are the same ModelOpt INT4 block-wise config (max-calibrated group scales) and the "
        "same W4A16_AWQ checkpoint without pre-quant scales; int4_gptq adds ModelOpt 0.47's GPTQ weight update "
        "(`gptq`: layer by layer, 1% damping, 128-column blocks, no activation reordering, which ModelOpt's GPTQ "
        "does not offer), calibrated on the same windows.",
        "- quantize wall / peak RSS: model load + ModelOpt calibration + export, in a fresh process. 'load avg' "
        "is the 1-minute load average around that run ('?' = not recorded): on this shared 2-core machine a load "
        "above ~2 means other work competed for the cores and the times are inflated (accuracy is unaffected).", "",
        "| quantization | quant_algo | perplexity | delta vs source | top-1 agreement | mean KL (nats/token) | "
        "max logit error | checkpoint MiB | calibration s | quantize wall s | peak RSS MiB | load avg |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['quant']} | {r['quant_algo'] or '-'} | {r['perplexity']:.3f} | "
                     f"{r['perplexity_delta_pct']:+.2f}% | {r['top1_agreement']:.4f} | {r['mean_kl']:.4f} | "
                     f"{r['max_logit_error']:.2f} | {r['checkpoint_bytes'] / 2**20:.1f} | {r['calibration_s']:.1f} | "
                     f"{r['quantize_wall_s']:.1f} | {r['quantize_peak_rss_mib']} | {r.get('loadavg_1m', '?')} |")
    if rows:
        lines += ["", f"Source perplexity: {rows[0]['source_perplexity']:.3f}."]
    lines += ["", "## Tensor-parallel shards (small random Llama: hidden 256, 8 heads, 4 KV heads, 4 layers, "
              "SmolLM2 tokenizer; calibration 4 x 64)", "",
              "SmolLM2 has 9 attention heads, so the planner refuses tp=2 or 4 for it "
              "(`parallelism.tp_size`, rule heads_tp).", "",
              "| quantization | tp_size | rank files | checkpoint MiB | same weights as tp=1 | mean KL vs source | "
              "top-1 agreement |", "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in tp_rows:
        lines.append(f"| {r['quant']} | {r['tp_size']} | {r['ranks']} | {r['checkpoint_bytes'] / 2**20:.1f} | "
                     f"{'yes' if r['same_weights_as_tp1'] else 'NO'} | {r['mean_kl']:.5f} | {r['top1_agreement']:.4f} |")
    return "\n".join(lines) + "\n" + (f"\n{earlier.rstrip()}\n" if earlier else "")


if __name__ == "__main__":
    sys.exit(main())
