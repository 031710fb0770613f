"""A one-model repository holding the trivial streaming model (templates/trivial_stream).

The model is named ``ensemble`` and has the ensemble's client-facing tensors, so the load
tester (and :class:`pipeline.serve.TritonServer`, which looks for ``ensemble/config.pbtxt``)
drive it exactly like a built repository. It needs no model, tokenizer or engine: tests and
``trtpipe loadtest selfcheck`` use it to measure the client's own ceiling.
"""

from __future__ import annotations

from pathlib import Path

from model_repo.generate import PERF_OUTPUTS, ModelPlan, default_sys_path, parse_config, render_config, write_python_model
from plugins.fsutil import atomic_dir

TEMPLATE = "trivial_stream"


def plan_trivial(*, model_name: str = "ensemble", max_batch_size: int = 64, token_delay_us: int = 0) -> ModelPlan:
    """The trivial model's values with their sources."""
    mp = ModelPlan(model_name, TEMPLATE)
    mp.set("model_name", model_name, "loadtest: the name clients send to (the ensemble's)")
    mp.set("max_batch_size", max_batch_size, "loadtest: requests Triton may hand to one execute() call")
    mp.set("token_delay_us", token_delay_us, "loadtest: per-step pause; 0 = as fast as the server sends")
    # The same perf outputs as the real ensemble, from the same table, so one client serves both.
    mp.set("perf_outputs", "".join(f',\n  {{ name: "{p.ensemble_name}" data_type: {p.data_type} dims: {p.dims} }}'
                                   for p in PERF_OUTPUTS), "model_repo.generate.PERF_OUTPUTS")
    return mp


def write_trivial_repository(out_dir: Path, *, token_delay_us: int = 0, max_batch_size: int = 64,
                             sys_path: list[str] | None = None) -> Path:
    """Render, validate (Triton's ModelConfig proto) and atomically write the repository; returns ``out_dir``."""
    mp = plan_trivial(max_batch_size=max_batch_size, token_delay_us=token_delay_us)
    text = render_config(mp)
    parse_config(text, f"{mp.name}/config.pbtxt")
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        write_python_model(TEMPLATE, tmp / mp.name, sys_path or default_sys_path())
        (tmp / mp.name / "config.pbtxt").write_text(text)
    return out_dir
