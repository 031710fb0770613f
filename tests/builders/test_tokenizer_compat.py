"""Every tokenizer a GPU-host build ships loads with the transformers of TensorRT-LLM 1.2.1's containers.

tritonserver:26.04-26.07-trtllm-python-py3 install TensorRT-LLM 1.2.1, which pins transformers 4.57.x
(4.57.3 in its wheel's install); the project writes tokenizers with transformers 5. The check runs
against the consumer: transformers 4.57.3 in a venv of its own (made once under .cache/compat/, from
PyPI), loading the bundle's and the engine folders' tokenizers, must give the same ids, decoded text,
chat prompt and special tokens as transformers 5 in the project's venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from builders.model_fetch import copy_tokenizer, fetch_embedded, portable_tokenizer_config
from pipeline.build import run_build
from tests.conftest import REPO_ROOT
from builders.spec import load_spec
from tests.conftest import write_spec

pytestmark = pytest.mark.slow  # a venv from PyPI once, tiny-model builds

CONTAINER_TRANSFORMERS = "4.57.3"
COMPAT_VENV = REPO_ROOT / ".cache" / "compat" / f"transformers-{CONTAINER_TRANSFORMERS}"
PROMPTS = ["What is the capital of France?", "The only thing we have to fear is",
           "héllo wörld 日本語 <|im_start|>x", "  spaces\n\ttabs <tool> end"]
# Run by both interpreters: what a preprocessing/postprocessing model and a chat client see of a tokenizer.
PROBE = r"""
import json, sys
import transformers
from transformers import AutoTokenizer
out = {}
for path in sys.argv[2:]:
    try:
        t = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        out[path] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    prompts = json.loads(sys.argv[1])
    out[path] = {"ids": [t.encode(p) for p in prompts],
                 "ids_plain": [t.encode(p, add_special_tokens=False) for p in prompts],
                 "text": [t.decode(t.encode(p), skip_special_tokens=True) for p in prompts],
                 "chat": (t.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                                tokenize=False) if t.chat_template else None),
                 "len": len(t), "special": sorted(t.all_special_tokens)}
print(json.dumps({"transformers": transformers.__version__, "tokenizers": out}))
"""


@pytest.fixture(scope="module")
def container_python() -> Path:
    """python of a venv with transformers 4.57.3 (+ jinja2 for chat templates), made once and reused."""
    python = COMPAT_VENV / "bin" / "python"
    if not python.is_file():
        tmp = COMPAT_VENV.with_name(COMPAT_VENV.name + f".tmp-{os.getpid()}")
        venv.EnvBuilder(with_pip=True, clear=True).create(tmp)
        subprocess.run([str(tmp / "bin" / "python"), "-m", "pip", "install", "-q",
                        f"transformers=={CONTAINER_TRANSFORMERS}", "jinja2"], check=True)
        tmp.rename(COMPAT_VENV)  # venv scripts keep tmp's path in their shebangs; `python -m` is used instead
    return python


def _probe(python: Path, dirs: list[Path]) -> dict:
    res = subprocess.run([str(python), "-c", PROBE, json.dumps(PROMPTS), *map(str, dirs)], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def shipped_tokenizers(tmp_path_factory, tiny_llama) -> dict[str, Path]:
    """The tokenizer folders GPU-host builds hand over: the trtllm bundle's (TensorRT-LLM absent here),
    the trtllm-llmapi engine folder, and the embedded default's copy (also one with extra special tokens)."""
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("tok")
    out = {}
    spec = write_spec(tmp / "bundle.yaml", tiny_llama, target="h100", runtime="trtllm")
    run_build(load_spec(spec, "h100"), out_root=tmp / "b1", progress=False)
    out["bundle"] = tmp / "b1" / "tiny" / "h100" / "bundle" / "tokenizer"
    spec = write_spec(tmp / "llmapi.yaml", tiny_llama, target="h100", runtime="trtllm-llmapi")
    run_build(load_spec(spec, "h100"), out_root=tmp / "b2", progress=False)
    out["llmapi_engine"] = tmp / "b2" / "tiny" / "h100" / "engine"
    copy_tokenizer(fetch_embedded("smollm2-135m-instruct"), tmp / "smollm2")
    out["smollm2"] = tmp / "smollm2"
    extra = AutoTokenizer.from_pretrained(str(out["smollm2"]))
    extra.add_special_tokens({"additional_special_tokens": ["<tool>", "</tool>"]})
    extra.save_pretrained(str(tmp / "extra-src"))  # transformers 5: extra_special_tokens as a list
    copy_tokenizer(tmp / "extra-src", tmp / "extra")
    out["extra_special_tokens"] = tmp / "extra"
    return out


def test_shipped_tokenizers_load_in_the_container_transformers_with_the_same_ids(container_python,
                                                                                shipped_tokenizers):
    dirs = list(shipped_tokenizers.values())
    old = _probe(container_python, dirs)
    new = _probe(Path(sys.executable), dirs)
    assert old["transformers"] == CONTAINER_TRANSFORMERS and new["transformers"].startswith("5.")
    for name, path in shipped_tokenizers.items():
        got, want = old["tokenizers"][str(path)], new["tokenizers"][str(path)]
        assert "error" not in got, f"{name}: {got.get('error')}"
        assert got == want, name
    assert new["tokenizers"][str(shipped_tokenizers["smollm2"])]["chat"], "the chat template travels with it"
    assert "<tool>" in new["tokenizers"][str(shipped_tokenizers["extra_special_tokens"])]["special"]


def test_the_unrewritten_transformers5_tokenizer_is_what_the_container_refuses(container_python):
    """Without the rewrite the container cannot load the default model's tokenizer (the P8 defect): this
    is what the test above would report if copy_tokenizer stopped rewriting."""
    src = fetch_embedded("smollm2-135m-instruct")
    assert json.loads((src / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    got = _probe(container_python, [src])["tokenizers"][str(src)]
    assert "TokenizersBackend does not exist" in got.get("error", ""), got


def test_portable_config_keeps_what_it_does_not_need_to_change():
    cfg = {"tokenizer_class": "LlamaTokenizer", "extra_special_tokens": {"a": "<a>"}, "model_max_length": 8}
    assert portable_tokenizer_config(cfg, has_tokenizer_json=True) == cfg
    assert portable_tokenizer_config({"tokenizer_class": "TokenizersBackend"}, has_tokenizer_json=False) == \
        {"tokenizer_class": "TokenizersBackend"}  # no tokenizer.json: nothing 4.57 could load instead
    fixed = portable_tokenizer_config({"tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["<x>"],
                                       "additional_special_tokens": ["<y>"]}, has_tokenizer_json=True)
    assert fixed == {"tokenizer_class": "PreTrainedTokenizerFast", "additional_special_tokens": ["<y>", "<x>"]}
