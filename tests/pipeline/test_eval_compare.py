"""pipeline/evaluate.py's comparison of a build with its source: differences, paired and unpaired intervals,
``gates.max_task_drop_pct`` and the tables. The inputs are lm-eval 0.4.13 results as its own files write them (the
samples logs' fields: doc_id, doc_hash, filter, one value per metric); the end-to-end runs are in
test_trtpipe_eval.py."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from pipeline.evaluate import Z95, Scored, compare, gate, side_by_side, table


def _scored(tmp_path, name: str, per_item: dict[str, list[float]], *, ppl: float = 10.0, ppl_se: float = 1.0) -> Scored:
    """A Scored of task ``t`` (acc per item, mean aggregation, a samples log) and task ``p`` (perplexity only)."""
    log = tmp_path / f"samples_t_{name}.jsonl"
    log.write_text("".join(json.dumps({"doc_id": i, "doc_hash": f"h{i}", "filter": "none", "acc": v}) + "\n"
                           for i, v in enumerate(per_item["acc"])), encoding="utf-8")
    acc = per_item["acc"]
    se = statistics.stdev(acc) / math.sqrt(len(acc))
    return Scored(metrics={"t": {"acc,none": {"value": statistics.fmean(acc), "stderr": se}},
                           "p": {"perplexity,none": {"value": ppl, "stderr": ppl_se}}},
                  n_samples={}, higher_is_better={"t": {"acc": True}, "p": {"perplexity": False}},
                  aggregation={"t": {"acc": "mean"}, "p": {"perplexity": "perplexity"}},
                  samples={"t": str(log)}, versions={}, commands=[], wall_s=0.0)


def test_paired_interval_is_the_per_item_difference(tmp_path):
    src = _scored(tmp_path, "s", {"acc": [1, 1, 1, 0, 1, 0, 1, 1]})
    bld = _scored(tmp_path, "b", {"acc": [1, 0, 1, 0, 1, 1, 0, 1]}, ppl=12.0, ppl_se=1.5)
    c = compare(bld, src)
    acc = c["t"]["acc,none"]
    diffs = [0, -1, 0, 0, 0, 1, -1, 0]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    assert acc["paired"] and acc["difference"] == pytest.approx(-0.125)
    assert acc["difference_stderr"] == pytest.approx(se)
    assert acc["ci95"] == pytest.approx([-0.125 - Z95 * se, -0.125 + Z95 * se])
    assert acc["drop_pct"] == pytest.approx(100 * 0.125 / 0.75)
    assert acc["significant"] is False
    # perplexity: aggregated by perplexity, not mean: unpaired, and a rise is a drop
    p = c["p"]["perplexity,none"]
    assert not p["paired"] and p["difference_stderr"] == pytest.approx(math.hypot(1.5, 1.0))
    assert p["drop_pct"] == pytest.approx(20.0) and p["higher_is_better"] is False


def test_items_that_differ_are_not_paired(tmp_path):
    src = _scored(tmp_path, "s", {"acc": [1, 1, 0, 1]})
    bld = _scored(tmp_path, "b", {"acc": [1, 0, 0, 1]})
    rows = [json.loads(x) for x in (tmp_path / "samples_t_b.jsonl").read_text().splitlines()]
    rows[2]["doc_hash"] = "another item"
    (tmp_path / "samples_t_b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    acc = compare(bld, src)["t"]["acc,none"]
    assert not acc["paired"]
    assert acc["difference_stderr"] == pytest.approx(math.hypot(bld.metrics["t"]["acc,none"]["stderr"],
                                                                src.metrics["t"]["acc,none"]["stderr"]))


def test_gate_fails_every_metric_over_the_limit_and_passes_the_rest(tmp_path):
    src = _scored(tmp_path, "s", {"acc": [1, 1, 1, 1, 0, 1, 1, 1]}, ppl=10.0)
    bld = _scored(tmp_path, "b", {"acc": [1, 1, 1, 1, 0, 1, 1, 0]}, ppl=10.4)
    c = compare(bld, src)  # acc drop 14.3%, perplexity rise 4%
    assert gate(c, None) == {"max_task_drop_pct": None, "passed": None, "failed": []}
    assert gate(c, 15.0)["passed"] is True
    g = gate(c, 5.0)
    assert g["passed"] is False and [(f["task"], f["metric"]) for f in g["failed"]] == [("t", "acc,none")]
    g = gate(c, 1.0)
    assert {f["metric"] for f in g["failed"]} == {"acc,none", "perplexity,none"}
    # a build better than its source never fails
    assert gate(compare(src, bld), 0.0)["passed"] is True


def test_a_source_scoring_zero_has_no_drop_to_report(tmp_path):
    src = _scored(tmp_path, "s", {"acc": [0, 0, 0, 0]})
    bld = _scored(tmp_path, "b", {"acc": [0, 0, 0, 0]})
    c = compare(bld, src)
    assert c["t"]["acc,none"]["drop_pct"] is None and gate(c, 0.0)["passed"] is True
    text = table({"metrics": bld.metrics, "comparison": c, "gate": gate(c, 1.0)})
    assert "| +0.0000 [+0.0000, +0.0000] | n/a | pass |" in text


def test_tables_show_both_scores_the_interval_and_the_verdict(tmp_path):
    src = _scored(tmp_path, "s", {"acc": [1, 1, 1, 1, 0, 1, 1, 1]})
    bld = _scored(tmp_path, "b", {"acc": [1, 1, 1, 1, 0, 1, 1, 0]})
    c = compare(bld, src)
    report = {"model": "m", "label": "m/cpu (int4_awq)", "metrics": bld.metrics, "comparison": c,
              "gate": gate(c, 5.0), "source": {"metrics": src.metrics}}
    text = table(report)
    assert "| t | acc,none ↑ | 0.8750 ± 0.1250 | 0.7500 ± 0.1637 | -0.1250 [" in text
    assert "| +14.29 | fail |" in text and "gates.max_task_drop_pct 5: FAILED: t acc,none +14.29%" in text
    both = side_by_side([report, {**report, "label": "m/cpu-fp8 (fp8)", "metrics": src.metrics,
                                  "comparison": compare(src, src)}])
    assert both.splitlines()[0] == "| task | metric | source | m/cpu (int4_awq) | m/cpu-fp8 (fp8) |"
    assert "| t | acc,none | 0.8750 ± 0.1250 | 0.7500 ± 0.1637 (+14.3%) | 0.8750 ± 0.1250 (+0.0%) |" in both


def test_source_model_comes_from_the_manifest(tmp_path, capsys, tiny_llama):
    from builders.spec import load_spec
    from pipeline.evaluate import source_model
    from plugins.errors import PipelineError
    from tests.conftest import DEFAULT_BUILD

    build = load_spec(DEFAULT_BUILD, "cpu")
    out = tmp_path / "out"
    out.mkdir()
    assert source_model(build, out) is None
    assert "has no manifest.json" in capsys.readouterr().out

    ckpt = tiny_llama  # a real HF folder (config, safetensors, tokenizer)
    (out / "manifest.json").write_text(json.dumps({"source_checkpoint": {"path": str(ckpt), "sha256": "abc"}}))
    s = source_model(build, out)
    assert (s.folder, s.digest, s.dtype, s.batch_size) == (ckpt, "abc", "float32", "8")  # cpu: float32

    # a pre-quantized source is not the baseline: model.reference is, and without one nothing is scored
    (out / "manifest.json").write_text(json.dumps({"source_checkpoint": {
        "path": str(ckpt), "sha256": "abc", "quantization": {"method": "autoawq"}}}))
    assert source_model(build, out) is None
    assert "model.reference names no unquantized model" in capsys.readouterr().out
    ref = build.model_copy(update={"model": build.model.model_copy(update={"reference": str(ckpt)})})
    s = source_model(ref, out)
    assert s.folder == ckpt and s.digest == f"reference:{ckpt}"

    with pytest.raises(PipelineError, match="--source nowhere: no config.json"):
        source_model(build, out, "nowhere")
    assert source_model(build, out, str(ckpt)).digest == f"path:{ckpt}"
