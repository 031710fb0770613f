"""LoRA adapters in the ``trtllm-llmapi`` engine folder: what TensorRT-LLM's LLM API and the Triton model read.

:func:`copy_adapters` copies each adapter's PEFT folder (``adapter_config.json``, ``adapter_model.safetensors``)
into ``<engine>/lora/<name>/`` and writes the table ``<engine>/lora/adapters.json``: one entry per adapter,
``{name, task_id, path (relative to the engine folder), rank}``. The LLM API's ``LoraConfig.lora_dir`` lists those
folders (builders.llmapi_options) and the Triton model turns a request's ``lora_task_id`` into
``LoRARequest(name, task_id, path)`` from the table (model_repo/templates/tensorrt_llm_llmapi/1/request_params.py).
An HF PEFT folder is what ``lora_ckpt_source: hf`` loads (tests/facts/trtllm_1_2_1/lora_llmapi.json).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from builders.lora import CONFIG_FILE, WEIGHTS_FILE, Adapter

LORA_DIR = "lora"
"""The adapters' folder inside the engine folder."""
TABLE = "adapters.json"
"""The adapter table inside :data:`LORA_DIR` (the name the Triton model reads)."""


def adapter_dir(engine_dir: Path, name: str) -> Path:
    """Where adapter ``name`` lives inside ``engine_dir``."""
    return Path(engine_dir) / LORA_DIR / name


def copy_adapters(adapters: list[Adapter], engine_dir: Path) -> list[dict]:
    """Copy (hard-link where the filesystem allows) each adapter's two files into ``engine_dir/lora/<name>/`` and
    write ``engine_dir/lora/adapters.json``; returns the table (task-id order). No adapters: nothing is written."""
    table: list[dict] = []
    for a in sorted(adapters, key=lambda a: a.task_id):
        out = adapter_dir(engine_dir, a.name)
        out.mkdir(parents=True, exist_ok=True)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            try:
                os.link(Path(a.path) / name, out / name)
            except OSError:
                shutil.copy2(Path(a.path) / name, out / name)
        table.append({"name": a.name, "task_id": a.task_id, "path": f"{LORA_DIR}/{a.name}", "rank": a.rank})
    if table:
        (Path(engine_dir) / LORA_DIR / TABLE).write_text(json.dumps(table, indent=2) + "\n")
    return table
