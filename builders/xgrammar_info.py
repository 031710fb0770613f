"""The xgrammar tokenizer-info file that TensorRT-LLM's Triton C++ backend loads for guided decoding.

The `tensorrt_llm` model of the `trtllm` runtime names this file in its ``xgrammar_tokenizer_info_path``
parameter. Upstream writes it with TensorRT-LLM's ``examples/generate_xgrammar_tokenizer_info.py``, which
calls ``tensorrt_llm.llmapi.tokenizer._xgrammar_tokenizer_info``. :func:`write_tokenizer_info` writes the same
file without TensorRT-LLM installed: the same three keys in the same order, computed the same way, and
serialized the same way. The facts it follows, with their commits, are in
tests/facts/trtllm_1_2_1/guided_decoding.json (``tokenizer_info_file``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

INFO_KEYS: tuple[str, ...] = ("encoded_vocab", "tokenizer_str", "stop_token_ids")
"""The keys of the file, in the order upstream writes them. model_instance_state.cc reads all three."""


def write_tokenizer_info(tokenizer_dir: Path, out: Path, vocab_size: int,
                         stop_token_ids: list[int] | None = None) -> Path:
    """Write the xgrammar tokenizer info of the Hugging Face tokenizer in ``tokenizer_dir`` to ``out``.

    The file is a JSON object with exactly these keys, in this order, as upstream writes it:

    - ``encoded_vocab`` (``list[str]``, one entry per token id ``0..n-1``): the tokenizer's own token
      strings (``get_vocab()`` sorted by id), not decoded text.
    - ``tokenizer_str`` (``str``): the fast tokenizer's serialized ``tokenizer.json``
      (``backend_tokenizer.to_str()``). The C++ backend gives it to ``DetectMetadataFromHF`` to find the
      vocabulary type and whether a prefix space is added.
    - ``stop_token_ids`` (``list[int]``): ``stop_token_ids`` if given, else ``[eos_token_id]`` (upstream
      always writes that one id).

    It is serialized with ``json.dump``'s defaults (ASCII-escaped, no indent), like upstream's script.

    Args:
        tokenizer_dir: a folder that ``transformers.AutoTokenizer`` loads as a fast tokenizer.
        out: the file to write. Missing parent folders are created. The file is written to a temporary file
            in the same folder and then moved into place with ``os.replace``, so a reader never sees a
            partial file.
        vocab_size: the model's vocabulary size. The C++ backend builds its ``xgrammar::TokenizerInfo`` with
            the engine's padded vocabulary size, and the file does not store it. It is used here to check
            that the tokenizer and the stop ids fit. The tokenizer may have fewer tokens (padding rows).
        stop_token_ids: the ids that end a guided answer. Defaults to ``[eos_token_id]``.

    Returns:
        ``out``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` is not a folder.
        ValueError: the tokenizer is not a fast (``tokenizers``-backed) one, so there is no
            ``tokenizer_str`` (the C++ backend needs one); its ids are not exactly ``0..n-1`` (the backend
            finds a token by its position in ``encoded_vocab``); ``vocab_size`` is smaller than the
            tokenizer; the stop ids are empty, missing (no ``eos_token_id``) or outside ``0..vocab_size-1``;
            or xgrammar refuses the result.
        OSError: the file cannot be written. No partial file is left behind.
    """
    import xgrammar as xgr
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer_dir = Path(tokenizer_dir)
    if not tokenizer_dir.is_dir():
        raise FileNotFoundError(f"tokenizer folder {tokenizer_dir} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(f"{tokenizer_dir}: {type(tokenizer).__name__} is not a fast tokenizer; the C++ backend "
                         "needs the tokenizer_str of a tokenizers-backed (tokenizer.json) tokenizer")

    vocab = tokenizer.get_vocab()
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        missing = sorted(set(range(ids[-1] + 1)) - set(ids))[:5] if ids else []
        raise ValueError(f"{tokenizer_dir}: token ids are not 0..{len(ids) - 1} (missing e.g. {missing} or "
                         "repeated); encoded_vocab is indexed by position, so ids would shift")
    if vocab_size < len(ids):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(ids)} tokens")

    if stop_token_ids is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{tokenizer_dir}: the tokenizer has no eos_token_id; pass stop_token_ids")
        stop_token_ids = [tokenizer.eos_token_id]
    stop_token_ids = [int(i) for i in stop_token_ids]
    if not stop_token_ids:
        raise ValueError("stop_token_ids is empty")
    bad = [i for i in stop_token_ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"stop token ids {bad} are outside 0..{vocab_size - 1}")

    # xgrammar's own reading of the tokenizer: it refuses what it cannot use, and its metadata is what the C++
    # GuidedDecoder derives from tokenizer_str (vocab type, prefix space).
    try:
        xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError from C++
        raise ValueError(f"xgrammar cannot use the tokenizer in {tokenizer_dir}: {exc}") from exc

    info = {
        "encoded_vocab": [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": stop_token_ids,
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


INFO_NAME = "xgrammar_tokenizer_info.json"
"""The file's name in a trtllm build's tokenizer folder (the C++ backend's ``xgrammar_tokenizer_info_path``)."""


def write_beside_tokenizer(tokenizer_dir: Path, hf_dir: Path) -> Path:
    """Write :data:`INFO_NAME` into ``tokenizer_dir`` for the model of ``hf_dir``: its config.json
    ``vocab_size`` and, as stop ids, the eos list of the tokenizer folder's generation_config.json (the ids the
    other runtimes end on), else the tokenizer's eos id.

    Raises:
        ValueError, OSError: as :func:`write_tokenizer_info`; a missing or unreadable config.json.
    """
    tokenizer_dir, hf_dir = Path(tokenizer_dir), Path(hf_dir)
    vocab_size = int(json.loads((hf_dir / "config.json").read_text())["vocab_size"])
    stops = None
    gen = tokenizer_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        stops = [int(t) for t in (eos if isinstance(eos, list) else [eos])] if eos is not None else None
    return write_tokenizer_info(tokenizer_dir, tokenizer_dir / INFO_NAME, vocab_size, stops)
