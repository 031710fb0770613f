"""LoRA adapters: what a PEFT adapter folder holds, read without its weights, and the rules it must pass.

:func:`read_adapters` reads each adapter of ``lora.adapters`` (its ``adapter_config.json`` and the safetensors
header of ``adapter_model.safetensors``: names, shapes, dtypes; no tensor data) into an :class:`Adapter`;
:func:`lora_problems` checks them against the model's config.json and the build, every problem at once, before
any weight is read. The plan's adapter bytes (:func:`adapter_bytes`) follow from the same shapes.

Formats and rules followed:

* PEFT 0.21 ``tuners/lora/config.py`` (LoraConfig: ``r``, ``lora_alpha``, ``use_rslora``, ``target_modules``,
  ``use_dora``, ``bias``, ``modules_to_save``, ``fan_in_fan_out``, ``rank_pattern``/``alpha_pattern``) and
  ``tuners/lora/layer.py`` (scaling ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA; the update
  ``B @ A`` with ``lora_A.weight`` [r, in] and ``lora_B.weight`` [out, r]); tensor names as PEFT's
  ``save_pretrained`` writes them (``base_model.model.<module path>.lora_{A,B}.weight``).
* TensorRT-LLM 1.2.1 ``tensorrt_llm/lora_manager.py``: the HF module names it maps to its own
  (``attn_q``: ``q_proj`` ... ``mlp_4h_to_h``: ``down_proj``) and their ids in ``LORA_MODULE_IDS``
  (tests/facts/trtllm_1_2_1/lora.json). Only these modules of dense decoder layers are served.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from builders.model_shape import ModelShape
from plugins.errors import Problem

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

HF_TO_TRTLLM = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_dense",
                "gate_proj": "mlp_h_to_4h", "up_proj": "mlp_gate", "down_proj": "mlp_4h_to_h"}
"""The HF projection names served with LoRA -> TensorRT-LLM's LoRA module names (the inverse of lora_manager.py's
default ``trtllm_modules_to_hf_modules``)."""

PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
"""The decoder-layer submodule that holds each projection (Llama-style layout: ``layers.<i>.<parent>.<name>``)."""

_KEY = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

REFUSED_QUANT = {
    "int8_sq": "TensorRT-LLM refuses LoRA with INT8 SmoothQuant (NVIDIA/TensorRT-LLM issue #12703)",
}
"""quantization.quant_algo values that upstream refuses with LoRA, and why. int8_sq: its SmoothQuant layers assert
``lora_runtime_params is None`` (tensorrt_llm/quantization/layers.py), so trtllm-build fails with --lora_plugin."""


@dataclass(frozen=True)
class Adapter:
    """One PEFT LoRA adapter, read from its folder without its weights.

    Attributes:
        name: its name in ``lora.adapters`` (the OpenAI model id clients send).
        path: the folder.
        task_id: its ``lora_task_id`` (1, 2, ... in the order of ``lora.adapters``; 0 is never an adapter).
        rank: ``r`` of adapter_config.json.
        alpha: ``lora_alpha``.
        use_rslora: rank-stabilised scaling.
        target_modules: the projections it adapts (HF names, sorted), from its tensors.
        layers: the decoder layers it adapts (sorted).
        shapes: ``(layer, module) -> (in_features, out_features)`` from ``lora_A`` [r, in] and ``lora_B`` [out, r].
        dtype: the tensors' safetensors dtype (``F16``, ``BF16``, ``F32``).
        base_model: ``base_model_name_or_path`` as PEFT wrote it (informational: a path on the trainer's machine).
    """

    name: str
    path: Path
    task_id: int
    rank: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]
    layers: tuple[int, ...]
    shapes: dict = field(default_factory=dict, compare=False)
    dtype: str = "F32"
    base_model: Optional[str] = None

    @property
    def scaling(self) -> float:
        """The factor of ``B @ A``: ``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA (PEFT tuners/lora/layer.py)."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def parameters(self) -> int:
        """Parameters of the adapter: ``r x (in + out)`` summed over its (layer, module) pairs."""
        return sum(self.rank * (i + o) for i, o in self.shapes.values())

    def summary(self) -> dict:
        """JSON-ready description (plan.json, the served adapter table)."""
        return {"name": self.name, "task_id": self.task_id, "path": str(self.path), "rank": self.rank,
                "alpha": self.alpha, "use_rslora": self.use_rslora, "scaling": self.scaling,
                "target_modules": list(self.target_modules), "layers": len(self.layers),
                "parameters": self.parameters(), "base_model": self.base_model}


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (name -> {dtype, shape, data_offsets}; its ``__metadata__`` dropped).
    Format: https://github.com/huggingface/safetensors (8-byte little-endian header length, then JSON).

    Raises:
        ValueError: not a safetensors file (short, or a header that is not JSON).
    """
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 2**20:
            raise ValueError(f"header length {n} is not a safetensors header")
        try:
            header = json.loads(fh.read(n))
        except ValueError as exc:
            raise ValueError(f"header is not JSON ({exc})") from None
    header.pop("__metadata__", None)
    return header


def _problem(field: str, value, rule: str, fix: str, code: str) -> Problem:
    return Problem(field, value, rule, fix, code=code)


def read_adapter(name: str, path: str | Path, task_id: int, field: str) -> tuple[Optional[Adapter], list[Problem]]:
    """Read one adapter folder (config and tensor header only). Returns (adapter or None, problems): a folder that
    cannot be read, a PEFT type other than LoRA, or a LoRA variant this project does not serve (DoRA, trained
    biases, ``modules_to_save``, per-module ranks, Conv1D layout) is a problem naming ``field``."""
    folder = Path(path)
    cfg_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not folder.exists() or folder.is_file():
        return None, [_problem(field, str(path), "no such folder" if not folder.exists() else "a file, not a folder",
                               "point it at the folder PEFT's save_pretrained wrote (it holds adapter_config.json "
                               "and adapter_model.safetensors)", "lora_adapter_missing")]
    if not cfg_path.is_file():
        return None, [_problem(field, str(path), f"no {CONFIG_FILE} in that folder (a PEFT LoRA adapter folder has "
                               f"{CONFIG_FILE} and {WEIGHTS_FILE})", "point it at the folder PEFT's "
                               "save_pretrained wrote", "lora_adapter_missing")]
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as exc:
        return None, [_problem(field, str(cfg_path), f"{CONFIG_FILE} is not JSON ({exc})", "rewrite it with "
                               "PEFT's save_pretrained", "lora_adapter_config")]
    problems: list[Problem] = []
    if cfg.get("peft_type") != "LORA":
        problems.append(_problem(field, cfg.get("peft_type"), "only PEFT LoRA adapters (peft_type LORA) are served",
                                 "train a LoRA adapter (peft.LoraConfig)", "lora_peft_type"))
    unsupported = [(k, cfg.get(k)) for k, ok in (("use_dora", lambda v: not v), ("bias", lambda v: v in (None, "none")),
                                                   ("modules_to_save", lambda v: not v),
                                                   ("fan_in_fan_out", lambda v: not v),
                                                   ("rank_pattern", lambda v: not v), ("alpha_pattern", lambda v: not v),
                                                   ("use_qalora", lambda v: not v), ("lora_bias", lambda v: not v),
                                                   ("layer_replication", lambda v: not v),
                                                   ("trainable_token_indices", lambda v: not v),
                                                   ("target_parameters", lambda v: not v),
                                                   ("alora_invocation_tokens", lambda v: not v))
                   if not ok(cfg.get(k))]
    for key, value in unsupported:
        problems.append(_problem(f"{field} ({CONFIG_FILE}: {key})", value, f"{key} = {value!r} is a LoRA variant "
                                 "TensorRT-LLM's LoRA path does not serve (plain low-rank updates only)",
                                 f"retrain without {key}, or merge this adapter into the base model "
                                 "(peft's merge_and_unload) and build that", "lora_variant"))
    rank = cfg.get("r")
    if not isinstance(rank, int) or rank < 1:
        problems.append(_problem(f"{field} ({CONFIG_FILE}: r)", rank, "r must be a positive integer",
                                 "rewrite it with PEFT's save_pretrained", "lora_adapter_config"))
    if not weights.is_file():
        hint = (" (adapter_model.bin found: pickled weights are not read)" if (folder / "adapter_model.bin").is_file()
                else "")
        problems.append(_problem(field, str(path), f"no {WEIGHTS_FILE} in that folder{hint}",
                                 "save the adapter with safe_serialization (PEFT's default)", "lora_adapter_missing"))
        return None, problems
    try:
        header = safetensors_header(weights)
    except (OSError, ValueError) as exc:
        problems.append(_problem(field, str(weights), f"cannot read its safetensors header: {exc}",
                                 "save the adapter again with PEFT's save_pretrained", "lora_adapter_weights"))
        return None, problems
    shapes: dict = {}
    halves: dict = {}
    dtypes = set()
    unserved = []
    for key, meta in sorted(header.items()):
        m = _KEY.match(key)
        if not m or PARENT.get(m.group(3)) != m.group(2):
            unserved.append(key)
            continue
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        halves.setdefault((layer, module), {})[ab] = tuple(meta.get("shape", ()))
        dtypes.add(meta.get("dtype"))
    if unserved and not unsupported:  # a variant's own tensors (DoRA's magnitudes) follow from its problem above
        problems.append(_problem(f"{field} ({WEIGHTS_FILE})", unserved[:3] + ([f"... {len(unserved)} in all"]
                                                                              if len(unserved) > 3 else []),
                                 "LoRA tensors of modules that are not served (served: "
                                 f"{', '.join(HF_TO_TRTLLM)} of the decoder layers)",
                                 "train the adapter with target_modules among those", "lora_target_module"))
    for (layer, module), pair in sorted(halves.items()):
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None or len(a) != 2 or len(b) != 2 or (isinstance(rank, int) and (a[0] != rank or
                                                                                              b[1] != rank)):
            problems.append(_problem(f"{field} ({WEIGHTS_FILE})", f"layers.{layer}.{module}: lora_A {a}, lora_B {b}",
                                     f"lora_A must be [r, in] and lora_B [out, r] with r = {rank}",
                                     "save the adapter again with PEFT's save_pretrained", "lora_adapter_weights"))
            continue
        shapes[(layer, module)] = (a[1], b[0])
    if not halves and not problems:
        problems.append(_problem(f"{field} ({WEIGHTS_FILE})", str(weights), "the file holds no LoRA tensors",
                                 "point it at a trained adapter", "lora_adapter_weights"))
    if problems:
        return None, problems
    adapter = Adapter(name=name, path=folder, task_id=task_id, rank=rank, alpha=float(cfg.get("lora_alpha", 8)),
                      use_rslora=bool(cfg.get("use_rslora", False)),
                      target_modules=tuple(sorted({mod for _, mod in shapes})),
                      layers=tuple(sorted({layer for layer, _ in shapes})), shapes=shapes,
                      dtype=sorted(d for d in dtypes if d)[0] if dtypes else "F32",
                      base_model=cfg.get("base_model_name_or_path"))
    return adapter, []


def expected_shape(shape: ModelShape, module: str) -> tuple[int, int]:
    """(in_features, out_features) of ``module`` in one dense decoder layer of ``shape`` (unsharded)."""
    h, q, kv, inter = (shape.hidden_size, shape.num_attention_heads * shape.head_dim,
                       shape.num_key_value_heads * shape.head_dim, shape.intermediate_size)
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}[module]


def read_adapters(adapters: dict[str, str], prefix: str = "lora.adapters") -> tuple[list[Adapter], list[Problem]]:
    """Every adapter of ``lora.adapters`` (task ids 1.. in order) and the problems of those that cannot be read."""
    out: list[Adapter] = []
    problems: list[Problem] = []
    for task_id, (name, path) in enumerate(adapters.items(), start=1):
        adapter, found = read_adapter(name, path, task_id, f"{prefix}.{name}")
        problems += found
        if adapter is not None:
            out.append(adapter)
    return out, problems


def max_rank(lora, adapters: list[Adapter]) -> int:
    """``lora.max_lora_rank``, or the largest rank of ``adapters`` when it is null (0 without adapters)."""
    return lora.max_lora_rank or max((a.rank for a in adapters), default=0)


def lora_problems(build, hf_config: dict, adapters: Optional[list[Adapter]] = None) -> list[Problem]:
    """The rules of ``lora`` for ``build`` and the model of ``hf_config``, every problem at once (no weight read).

    Names valid as OpenAI model ids and distinct from the build's own; each adapter readable and a plain LoRA of
    served modules; its tensors shaped for this model's layers; rank <= max_lora_rank; max_cpu_loras >= max_loras
    (TensorRT-LLM copies adapters to the GPU cache from the host cache, which keeps them while in use);
    quantization upstream refuses with LoRA refused
    (:data:`REFUSED_QUANT`); bfloat16 refused on the trtllm runtime (no bfloat16 .npy reader for
    lora_prefetch_dir); KV-cache reuse refused on the portable runtime (its prefix cache is not keyed by adapter).

    Args:
        build: the resolved build (builders.spec.ResolvedBuild).
        hf_config: the model's config.json.
        adapters: already read (None: read them here).
    """
    lora = build.settings.lora
    if not lora.adapters:
        return []
    where = build.where
    problems: list[Problem] = []
    for name in lora.adapters:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", name):
            problems.append(_problem(where(f"lora.adapters.{name}"), name, "an adapter name is what clients send as "
                                     "`model`: letters, digits, '.', '_' and '-', starting with a letter or digit, at "
                                     "most 64 characters", "rename it", "lora_name"))
        elif name == build.name:
            problems.append(_problem(where(f"lora.adapters.{name}"), name, "the base model is served under the build "
                                     "name, so an adapter cannot have it", "rename the adapter", "lora_name"))
    if adapters is None:
        adapters, read = read_adapters(lora.adapters, where("lora.adapters"))
        problems += read
    shape = ModelShape.from_hf_config(hf_config)
    for a in adapters:
        field = where(f"lora.adapters.{a.name}")
        if lora.max_lora_rank is not None and a.rank > lora.max_lora_rank:
            problems.append(_problem(where("lora.max_lora_rank"), lora.max_lora_rank,
                                     f"adapter {a.name!r} has rank {a.rank}, above max_lora_rank",
                                     f"set lora.max_lora_rank to at least {a.rank} (or null: the largest rank)",
                                     "lora_rank"))
        bad_layers = [layer for layer in a.layers if layer >= shape.num_hidden_layers]
        if bad_layers:
            problems.append(_problem(field, f"layers {bad_layers}", f"the model has {shape.num_hidden_layers} layers",
                                     "use an adapter trained on this base model", "lora_base"))
        for (layer, module), got in sorted(a.shapes.items()):
            want = expected_shape(shape, module)
            if got != want:
                problems.append(_problem(field, f"layers.{layer}.{module}: in {got[0]}, out {got[1]}",
                                         f"this model's {module} has in {want[0]}, out {want[1]} "
                                         f"({shape.architecture})", "use an adapter trained on this base model",
                                         "lora_base"))
                break
        if shape.num_experts and "mlp" in {PARENT[m] for m in a.target_modules}:
            problems.append(_problem(field, list(a.target_modules), "LoRA on a mixture-of-experts model's MLP is not "
                                     "served (only its attention projections)", "train the adapter on q_proj, "
                                     "k_proj, v_proj and o_proj only", "lora_target_module"))
    # TensorRT-LLM's PeftCacheManager::ensureBatch copies host -> GPU; upstream does not check the counts itself
    if lora.max_cpu_loras < lora.max_loras:
        problems.append(_problem(where("lora.max_cpu_loras"), lora.max_cpu_loras, "adapters reach the GPU cache only "
                                 f"from the host cache, so fewer host slots than max_loras ({lora.max_loras}) leave GPU "
                                 "slots unused",
                                 f"set lora.max_cpu_loras to {lora.max_loras} or more", "lora_cache"))
    if build.settings.runtime == "trtllm" and build.settings.dtype == "bfloat16":
        problems.append(_problem(where("dtype"), "bfloat16", "the trtllm runtime serves adapters from "
                                 "lora_prefetch_dir, whose .npy reader in TensorRT-LLM 1.2.1 reads float16 and float32 "
                                 "but no bfloat16, and LoRA weights must be in the engine dtype "
                                 "(tests/facts/trtllm_1_2_1/lora.json)", "set dtype: float16 for a build with "
                                 "lora.adapters on the trtllm runtime", "lora_dtype"))
    quant = build.settings.quantization.quant_algo
    if quant in REFUSED_QUANT:
        problems.append(_problem(where("quantization.quant_algo"), quant, REFUSED_QUANT[quant],
                                 "choose another quant_algo (fp8, int4_awq) for a build with lora.adapters",
                                 "lora_quant"))
    if build.settings.runtime == "pytorch" and build.settings.serving.enable_kv_cache_reuse:
        problems.append(_problem(where("serving.enable_kv_cache_reuse"), True, "the portable runtime's prefix cache "
                                 "is not keyed by adapter, so two adapters would share KV blocks they compute "
                                 "differently", "set serving.enable_kv_cache_reuse false for a build with "
                                 "lora.adapters", "lora_kv_reuse"))
    return problems


def adapter_bytes(adapter: Adapter, dtype_bytes: int, tp: int = 1) -> int:
    """Device bytes of one adapter on one tensor-parallel rank: ``r x (in + out) x dtype_bytes`` per (layer,
    module), each side split over ``tp`` the way the base projection is (column-parallel q/k/v/gate/up split
    ``out``, row-parallel o/down split ``in``; the rank dimension is not split), rounded up."""
    total = 0
    for (_, module), (n_in, n_out) in adapter.shapes.items():
        if module in ("o_proj", "down_proj"):
            n_in = -(-n_in // tp)
        else:
            n_out = -(-n_out // tp)
        total += adapter.rank * (n_in + n_out) * dtype_bytes
    return total


def slot_bytes(shape: ModelShape, modules: tuple[str, ...], rank: int, dtype_bytes: int, tp: int = 1) -> int:
    """Bytes of one LoRA cache slot on one rank: an adapter of ``rank`` on ``modules`` of every layer (the
    largest adapter the cache must hold; TensorRT-LLM sizes its pages the same way, by max_lora_rank)."""
    per_layer = 0
    for module in modules:
        n_in, n_out = expected_shape(shape, module)
        if module in ("o_proj", "down_proj"):
            n_in = -(-n_in // tp)
        else:
            n_out = -(-n_out // tp)
        per_layer += rank * (n_in + n_out) * dtype_bytes
    return per_layer * shape.num_hidden_layers


LORA_DIR = "lora"
"""The adapters' folder inside an engine folder (the runtimes that read HF PEFT folders: pytorch, trtllm-llmapi)."""
TABLE = "adapters.json"
"""The adapter table inside :data:`LORA_DIR`: ``[{name, task_id, path, rank, alpha, use_rslora, scaling,
target_modules, layers, parameters}]`` in task-id order (path relative to the engine folder)."""


def adapters_of(lora) -> list[Adapter]:
    """Read again the adapters of a plan (builders.plan.LoraPlan; None: none) for a stage that serves them, with the
    plan's task ids (config and header only: the plan checked them).

    Raises:
        StageError: an adapter cannot be read any more (changed on disk since the plan read it).
    """
    from plugins.errors import StageError

    if lora is None:
        return []
    out = []
    for a in lora.adapters:
        adapter, problems = read_adapter(a.name, a.path, a.task_id, f"lora.adapters.{a.name}")
        if adapter is None:
            raise StageError("LoRA adapter cannot be read: " + "; ".join(p.render() for p in problems))
        out.append(adapter)
    return out


def adapters_digest(adapters: list[Adapter]) -> str:
    """SHA-256 over each adapter's name, task id and the bytes of its two files: a stage that serves adapters keys on
    it, so an adapter retrained in place reruns that stage."""

    h = hashlib.sha256()
    for a in sorted(adapters, key=lambda a: a.task_id):
        h.update(f"{a.name}\0{a.task_id}\0".encode())
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            with open(a.path / name, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def adapter_dir(engine_dir: Path, name: str) -> Path:
    """Where adapter ``name`` lives inside ``engine_dir`` (:func:`write_adapters`)."""
    return Path(engine_dir) / LORA_DIR / name


def write_adapters(adapters: list[Adapter], engine_dir: Path) -> list[dict]:
    """Copy (hard-link where the filesystem allows) each adapter's two PEFT files into ``engine_dir/lora/<name>/`` and
    write ``engine_dir/lora/adapters.json`` (:data:`TABLE`): what the runtimes that read HF PEFT folders load (the
    portable runtime's adapters.py; the LLM API's ``LoRARequest.lora_path``, ``lora_ckpt_source: hf``). Returns the
    table ([] and nothing written without adapters)."""
    import os
    import shutil

    table = []
    for a in sorted(adapters, key=lambda a: a.task_id):
        dest = adapter_dir(engine_dir, a.name)
        dest.mkdir(parents=True, exist_ok=True)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            try:
                os.link(a.path / name, dest / name)
            except OSError:
                shutil.copyfile(a.path / name, dest / name)
        table.append({**{k: v for k, v in a.summary().items() if k not in ("path", "base_model")},
                      "path": f"{LORA_DIR}/{a.name}"})
    if table:
        (Path(engine_dir) / LORA_DIR / TABLE).write_text(json.dumps(table, indent=2) + "\n")
    return table
