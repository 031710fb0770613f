"""Is the source checkpoint whole? Its safetensors headers against what its config.json implies, no weight read.

A local checkpoint whose files lack tensors its architecture has (a layer removed, a shard the index names but the
folder lacks) loads without an error in transformers: the missing weights are initialised at random, the build
quantizes noise and the verify stage, which loads the source the same way, finds nothing wrong. This module
refuses such a checkpoint before any stage runs (builders.preflight.make_plan, with the model folder at hand):

* the files: ``model.safetensors``, or the shards ``model.safetensors.index.json`` names (transformers 5.24
  ``modeling_utils._get_resolved_checkpoint_files``: the single file first, then the index; config.json's
  ``transformers_weights`` names another), each read with ``safetensors.safe_open`` for its header only (names,
  shapes, dtypes); a shard the index names that is absent or unreadable, and a tensor the index maps to a shard
  that does not hold it, are problems of their own;
* the tensors: transformers' own loader (``from_pretrained`` with ``state_dict``: its key renames and weight
  conversions, e.g. Mixtral's experts merged into one tensor, tied weights, ``_keys_to_ignore_on_load_*``)
  run on the ``meta`` device with empty tensors of the header shapes: nothing is allocated or read, and its
  loading report (``output_loading_info``: missing, unexpected, mismatched keys, conversion errors) is the
  verdict, exactly as the real load would give it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from plugins.errors import Problem

log = logging.getLogger(__name__)

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
SHOWN = 5
"""How many names a problem lists before it says how many more there are."""
FIX = ("re-download the checkpoint (every shard the index names), or re-export it with "
       "`model.save_pretrained(dir)` from a model that loads whole")


@dataclass
class CheckpointTensors:
    """What a checkpoint folder's safetensors headers hold.

    Attributes:
        files: the weight files transformers would read (folder-relative names), in load order.
        index: the index file's name when the checkpoint is sharded, else None.
        tensors: tensor name -> (shape, safetensors dtype string such as ``"F32"``, file name).
        problems: what is wrong with the files themselves (absent or unreadable shard, index entries a shard
            lacks, no weight file transformers loads).
    """

    files: list[str] = field(default_factory=list)
    index: str | None = None
    tensors: dict[str, tuple[tuple[int, ...], str, str]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def _tensors(n: int) -> str:
    return f"{n} tensor{'s' if n != 1 else ''}"


def _names(items, shown: int = SHOWN) -> str:
    items = list(items)
    head = ", ".join(str(i) for i in items[:shown])
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


def read_headers(folder: Path, field_name: str = "model.source") -> CheckpointTensors:
    """The tensors of ``folder``'s weight files, from their headers only (``safe_open``: no tensor data read).

    Returns:
        a :class:`CheckpointTensors`; its ``problems`` name the file (index or shard), what is wrong and the fix.
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    out = CheckpointTensors()
    where = str(folder)
    explicit = None
    try:
        explicit = json.loads((folder / "config.json").read_text()).get("transformers_weights")
    except (OSError, ValueError, AttributeError):
        pass
    if isinstance(explicit, str) and explicit:
        single, index = (None, explicit) if explicit.endswith(".json") else (explicit, None)
    elif (folder / SAFE_WEIGHTS_NAME).is_file():
        single, index = SAFE_WEIGHTS_NAME, None
    elif (folder / SAFE_WEIGHTS_INDEX_NAME).is_file():
        single, index = None, SAFE_WEIGHTS_INDEX_NAME
    else:
        present = sorted(p.name for p in folder.glob("*.safetensors"))
        out.problems.append(Problem(field_name, where, f"has neither {SAFE_WEIGHTS_NAME} nor {SAFE_WEIGHTS_INDEX_NAME}"
                                    f", so transformers loads none of its weight files ({_names(present)})",
                                    f"restore the index file of the shards, or {FIX}", code="checkpoint_files"))
        return out
    expected: dict[str, str] = {}  # tensor -> shard, from the index
    if index is not None:
        out.index = index
        try:
            weight_map = json.loads((folder / index).read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            out.problems.append(Problem(field_name, str(folder / index), f"the index file is unreadable ({exc})",
                                        FIX, code="checkpoint_files"))
            return out
        expected = {str(k): str(v) for k, v in weight_map.items()}
        out.files = sorted(set(expected.values()))
    else:
        out.files = [single]
    for name in out.files:
        path = folder / name
        if not path.is_file():
            names = sorted(k for k, v in expected.items() if v == name)
            held = f" ({_tensors(len(names))}: {_names(names)})" if names else ""
            out.problems.append(Problem(field_name, where, f"{index or 'config.json transformers_weights'} names the "
                                        f"weight file {name}{held}, which the folder does not have",
                                        FIX, code="checkpoint_shard_missing"))
            continue
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    out.tensors[key] = (tuple(int(d) for d in sl.get_shape()), str(sl.get_dtype()), name)
        except (SafetensorError, OSError, ValueError) as exc:
            out.problems.append(Problem(field_name, str(path), f"is not a readable safetensors file ({exc}): a "
                                        "truncated download or a partial copy", FIX,
                                        code="checkpoint_shard_unreadable"))
            continue
        lacking = sorted(k for k, v in expected.items() if v == name and k not in out.tensors)
        if lacking:
            out.problems.append(Problem(field_name, where, f"{index} maps {_tensors(len(lacking))} to {name}, which "
                                        f"does not hold them: {_names(lacking)}", FIX, code="checkpoint_index"))
    return out


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
           "F8_E5M2": "float8_e5m2"}


def _model_class(config, folder: Path, trust_remote_code: bool):
    """The class ``AutoModelForCausalLM.from_pretrained(folder)`` builds for ``config``: the checkpoint's own
    (``auto_map``) when its code may run, else the library's for the config (transformers 5.24 auto_factory)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.auto_factory import _get_model_class

    ref = (getattr(config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    if ref and trust_remote_code:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        return get_class_from_dynamic_module(ref, str(folder))
    return _get_model_class(config, AutoModelForCausalLM._model_mapping)


def loading_report(folder: Path, tensors: dict[str, tuple[tuple[int, ...], str, str]], *,
                   trust_remote_code: bool = False, unquantized: bool = False) -> dict:
    """transformers' loading report of ``tensors`` (names, shapes, dtypes) into the model of ``folder``'s
    config.json, on the meta device: ``from_pretrained(config=..., state_dict=<empty meta tensors>,
    device_map={"": "meta"}, ignore_mismatched_sizes=True, output_loading_info=True)``.

    ``unquantized``: build the model without the config's ``quantization_config`` (the tensors are a pre-quantized
    checkpoint's, named and shaped as they are read back dequantized).

    Returns:
        ``{"model": class name, "missing_keys": [...], "unexpected_keys": [...],
        "mismatched_keys": [(name, checkpoint shape, model shape)], "conversion_errors": {name: message}}``,
        keys as the model names them (after transformers' renames and conversions).

    Raises:
        whatever transformers raises when the config cannot be read or the model not built.
    """
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    if unquantized and hasattr(config, "quantization_config"):  # the model as the dequantized weights load into it
        del config.quantization_config
    model_class = _model_class(config, folder, trust_remote_code)
    state = {k: torch.empty(shape, dtype=getattr(torch, _DTYPES.get(dt, "uint8")), device="meta")
             for k, (shape, dt, _) in tensors.items()}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its own report table: the problems below say it once
    try:
        # from_pretrained refuses a state_dict with a folder: the class is resolved as AutoModelForCausalLM would
        model, info = model_class.from_pretrained(
            None, config=config, state_dict=state, device_map={"": "meta"}, dtype=torch.float32,
            ignore_mismatched_sizes=True, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(level)
    return {"model": type(model).__name__, "missing_keys": sorted(info.get("missing_keys") or ()),
            "unexpected_keys": sorted(info.get("unexpected_keys") or ()),
            "mismatched_keys": sorted((str(m[0]), tuple(m[1]), tuple(m[2])) for m in info.get("mismatched_keys") or ()),
            "conversion_errors": {str(k): str(v) for k, v in (info.get("conversion_errors") or {}).items()}}


def checkpoint_problems(folder: Path, *, trust_remote_code: bool = False,
                        field_name: str = "model.source", prequantized=None) -> list[Problem]:
    """Every way ``folder``'s weight files differ from what its config.json implies, as Problems (empty: whole).

    ``prequantized`` (builders.prequant.Prequantized): the folder holds a pre-quantized checkpoint; its tensors are
    checked under the names and float shapes they are read back as (builders.prequant.float_headers), against the
    model without its quantization_config.

    Codes: ``checkpoint_files`` (no weight file transformers loads, unreadable index), ``checkpoint_shard_missing``,
    ``checkpoint_shard_unreadable``, ``checkpoint_index`` (the index maps a tensor to a shard that lacks it),
    ``checkpoint_missing``, ``checkpoint_unexpected``, ``checkpoint_shape`` (transformers' report: see
    :func:`loading_report`). Each names the file, the first tensors and how many, and the fix.
    """
    folder = Path(folder)
    found = read_headers(folder, field_name)
    problems = list(found.problems)
    if not found.files or (not found.tensors and problems):
        return problems
    tensors = found.tensors
    if prequantized is not None:
        from builders.prequant import float_headers

        tensors = float_headers(prequantized, found.tensors)
    try:
        report = loading_report(folder, tensors, trust_remote_code=trust_remote_code,
                                unquantized=prequantized is not None)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types; the real load reports it again
        log.warning("could not check the tensors of %s against its config.json on the meta device: %s", folder, exc)
        return problems
    files = f"the shards of {found.index}" if found.index else found.files[0]
    model = report["model"]
    if report["missing_keys"]:
        missing = report["missing_keys"]
        problems.append(Problem(field_name, str(folder), f"{model} (config.json) has {_tensors(len(missing))} that "
                                f"{files} {'do' if found.index else 'does'} not hold, which transformers would "
                                "initialise at random: "
                                f"{_names(missing)}", FIX, code="checkpoint_missing"))
    if report["unexpected_keys"]:
        extra = report["unexpected_keys"]
        where = sorted({found.tensors[k][2] for k in extra if k in found.tensors})
        problems.append(Problem(field_name, str(folder), f"{', '.join(where) or files} holds {_tensors(len(extra))} "
                                f"{model} (config.json) has no place for: {_names(extra)}: another architecture's "
                                "weights, or a config.json that does not belong to them", f"use the config.json "
                                f"the weights were saved with, or {FIX}", code="checkpoint_unexpected"))
    shaped = [f"{name} {list(got)} in {found.tensors[name][2] if name in found.tensors else files} (the "
              f"architecture implies {list(want)})" for name, got, want in report["mismatched_keys"]]
    shaped += [f"{name} (conversion failed: {msg.strip().splitlines()[-1] if msg.strip() else msg})"
               for name, msg in report["conversion_errors"].items()]
    if shaped:
        verb = "do" if len(shaped) != 1 else "does"
        problems.append(Problem(field_name, str(folder), f"{_tensors(len(shaped))} {verb} not have the shape {model} "
                                f"(config.json) implies: {_names(shaped)}", f"use the config.json the weights were "
                                f"saved with, or {FIX}", code="checkpoint_shape"))
    return problems


def refuse_missing(info: dict, hf_dir: Path, stage: str) -> None:
    """Raise StageError when transformers loaded ``hf_dir`` with missing keys (``info``: the loading report of
    ``from_pretrained(..., output_loading_info=True)``): those weights are random, and a stage that goes on
    quantizes or scores noise. ``stage`` names the stage in the message."""
    from plugins.errors import StageError

    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise StageError(f"the {stage} stage loaded the source checkpoint {hf_dir} with {len(missing)} tensors "
                         f"missing, which transformers initialised at random: {_names(missing)}. Fix: {FIX}")


def load_source_model(hf_dir: Path, dtype, *, trust_remote_code: bool, stage: str):
    """``AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype)`` (a torch dtype, CPU), refused with
    :func:`refuse_missing` when a tensor of the model was not in the files (``trust_remote_code``:
    ``model.trust_remote_code``)."""
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype, trust_remote_code=trust_remote_code,
                                                       output_loading_info=True)
    refuse_missing(info, Path(hf_dir), stage)
    return model
