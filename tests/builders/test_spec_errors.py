"""Bad build files fail fast, name the field, and leave no output behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from plugins.errors import SpecError
from tests.conftest import REPO_ROOT
from builders.spec import load_spec


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "build.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_default_build_file_loads():
    b = load_spec(REPO_ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    assert b.settings.quantization.quant_algo == "int4_awq"
    assert b.settings.quantization.group_size == 64
    assert b.settings.runtime == "pytorch"


def test_unknown_field_is_named_with_did_you_mean(tmp_path):
    p = _write(tmp_path, """
        name: t
        limits:
          max_batch_sise: 4
        """)
    with pytest.raises(SpecError) as err:
        load_spec(p, "cpu")
    msg = str(err.value)
    assert "limits.max_batch_sise" in msg
    assert "max_batch_size" in msg  # the did-you-mean
    assert err.value.codes() == ["unknown_key"]


def test_all_problems_reported_at_once(tmp_path):
    p = _write(tmp_path, """
        name: t
        quantization: {quant_algo: int3}
        limits: {tokens_per_block: 33}
        """)
    with pytest.raises(SpecError) as err:
        load_spec(p, "cpu")
    fields = " ".join(err.value.fields())
    assert "quantization.quant_algo" in fields and "limits.tokens_per_block" in fields


def test_bad_value_in_target_override_points_at_the_override(tmp_path):
    p = _write(tmp_path, """
        name: t
        targets:
          cpu:
            parallelism: {tp_size: 0}
        """)
    with pytest.raises(SpecError) as err:
        load_spec(p, "cpu")
    assert err.value.fields() == ["targets.cpu.parallelism.tp_size"]


@pytest.mark.parametrize("case,field", [
    ("unknown_field", "serving.streamin"),
    ("missing_model", "model.source"),
])
def test_cli_build_fails_fast_and_writes_nothing(tmp_path, case, field):
    body = {
        "unknown_field": "name: bad\nserving: {streamin: true}\n",
        "missing_model": f"name: bad\nmodel: {{source: {tmp_path / 'no-such-model'}}}\n",
    }[case]
    spec = tmp_path / "bad.yaml"
    spec.write_text(body)
    out = tmp_path / "out"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "build", str(spec), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr
    assert "Fix:" in proc.stderr
    assert not out.exists() or not any(out.rglob("*")), list(out.rglob("*"))
    print(f"{case}: failed in {elapsed:.2f} s (interpreter start included)")


def test_incomplete_model_folder_lists_what_is_missing(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = _write(tmp_path, f"name: t\nmodel: {{source: {model}}}\n")
    from builders.model_fetch import resolve_source

    b = load_spec(spec, "cpu")
    with pytest.raises(SpecError) as err:
        resolve_source(b.model.source)
    assert "model.source" in str(err.value) and "safetensors" in str(err.value)


MISPLACED = [  # (YAML, the field named, the did-you-mean)
    ("parallelism: {tensor_paralel_size: 2}", "parallelism.tensor_paralel_size", "tp_size"),  # a misspelt alias
    ("limits: {max_modle_len: 4096}", "limits.max_modle_len", "max_seq_len"),  # vLLM's max_model_len, misspelt
    ("limits: {max_batch_tokns: 4096}", "limits.max_batch_tokns", "max_num_tokens"),
    ("max_batch_size: 16", "max_batch_size", "limits.max_batch_size"),  # a known key at the wrong level
    ("serving: {max_batch_szie: 16}", "serving.max_batch_szie", "limits.max_batch_size"),  # ... and misspelt
    ("limits: {kv_cache_free_gpu_mem_fractoin: 0.8}", "limits.kv_cache_free_gpu_mem_fractoin",
     "serving.kv_cache_free_gpu_mem_fraction"),
    ("parallelism: {max_model_len: 4096}", "parallelism.max_model_len", "limits.max_seq_len"),  # alias, wrong level
    ("quantization: {seq_len: 512}", "quantization.seq_len", "quantization.calibration.seq_len"),
    ("targets: {cpu: {max_batch_size: 16}}", "targets.cpu.max_batch_size", "targets.cpu.limits.max_batch_size"),
    ("targets: {cpu: {limits: {tensor_parallel_size: 2}}}", "targets.cpu.limits.tensor_parallel_size",
     "targets.cpu.parallelism.tp_size"),
]


@pytest.mark.parametrize("yaml_text,field,hint", MISPLACED, ids=[f for _, f, _ in MISPLACED])
def test_misspelt_alias_or_key_at_another_level_gets_a_did_you_mean(tmp_path, yaml_text, field, hint):
    """An unknown key gets the key it stands for: a misspelling of one of its other tools' names (KEY_ALIASES), or
    a key of another section (named by its path), not just the list of this section's keys."""
    p = _write(tmp_path, f"name: t\n{yaml_text}\n")
    with pytest.raises(SpecError) as err:
        load_spec(p, "cpu")
    (problem,) = err.value.problems
    assert (problem.field, problem.code) == (field, "unknown_key")
    assert f"Did you mean '{hint}'?" in problem.fix, problem.fix
