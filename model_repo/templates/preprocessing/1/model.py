# The `preprocessing` model: text -> token ids, with the engine's limits enforced per request
# (TensorRT-LLM backend interface: all_models/inflight_batcher_llm/preprocessing).

import json as _json
import os as _os
import sys as _sys

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpipe_runtime.params import param as _param
from trtpipe_runtime.lifeline import watch_parent

# each input as its error messages name it: the client tensor of the ensemble / BLS it carries, then its own name
FIELDS = {"QUERY": "text_input (QUERY)", "REQUEST_OUTPUT_LEN": "max_tokens (REQUEST_OUTPUT_LEN)",
          "BAD_WORDS_DICT": "bad_words (BAD_WORDS_DICT)", "STOP_WORDS_DICT": "stop_words (STOP_WORDS_DICT)",
          "EMBEDDING_BIAS_WORDS": "embedding_bias_words (EMBEDDING_BIAS_WORDS)"}


def _text(value, field):
    """One BYTES element as text; ValueError naming ``field`` when it is not UTF-8."""
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{field} is not UTF-8 (byte {value[exc.start:exc.start + 1]!r} at offset {exc.start}): "
                         "send the text UTF-8 encoded") from None


def _required(request, name):
    """A required input; ValueError naming it when absent (Triton checks required inputs only when the number of
    inputs is out of range: an optional input sent instead of a required one reaches the model)."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        raise ValueError(f"{FIELDS[name]} is missing: send text_input (QUERY) and max_tokens (REQUEST_OUTPUT_LEN)")
    return t


def _pack_words(tokenizer, rows, extra_ids=(), field="words"):
    """Words per batch row -> TensorRT-LLM's [B, 2, L] list: flat ids, then end offsets (-1 padded).
    ``extra_ids`` are token ids added to every row as one-token words (the tokenizer's other stop ids);
    ``field`` names the input in errors."""
    flats, offsets = [], []
    for words in rows:
        ids, offs = [], []
        for tok in extra_ids:
            ids.append(int(tok))
            offs.append(len(ids))
        for w in words:
            w = _text(w, field)
            if not w:
                continue
            toks = tokenizer.encode(w, add_special_tokens=False)
            ids += toks
            offs.append(len(ids))
        flats.append(ids)
        offsets.append(offs)
    width = max([1] + [len(f) for f in flats])
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (f, o) in enumerate(zip(flats, offsets)):
        out[i, 0, :len(f)] = f
        out[i, 1, :len(o)] = o
    return out


def _embedding_bias(tokenizer, words_rows, weights_rows, vocab):
    """EMBEDDING_BIAS ([B, vocab] float32; [B, 0] when no words were sent): each word's weight is added to
    the logit of every token the word encodes to (without special tokens), as upstream's preprocessing
    builds it; the runtime adds the vector to each step's logits."""
    if words_rows is None and weights_rows is None:
        return None
    if words_rows is None or weights_rows is None:
        raise ValueError("embedding_bias_words and embedding_bias_weights must be sent together")
    out = np.zeros((len(words_rows), vocab), dtype=np.float32)
    for b, (words, weights) in enumerate(zip(words_rows, weights_rows)):
        words = [_text(w, FIELDS["EMBEDDING_BIAS_WORDS"]) for w in words]
        if len(words) != len(weights):
            raise ValueError(f"embedding_bias_words has {len(words)} words but embedding_bias_weights "
                             f"{len(weights)} weights: send one weight per word")
        for word, weight in zip(words, weights):
            if not np.isfinite(weight):
                raise ValueError(f"embedding_bias_weights: {weight} for {word!r} is not a finite number")
            for tok in tokenizer.encode(word, add_special_tokens=False):
                out[b, tok] += float(weight)
    return out


class TritonPythonModel:
    def initialize(self, args):
        watch_parent(f"the {args.get('model_name', 'model')} stub")  # ends when tritonserver does, even killed
        from transformers import AutoTokenizer

        cfg = _json.loads(args["model_config"])
        self.tokenizer_dir = _param(cfg, "tokenizer_dir")
        # model.trust_remote_code of the build file: whether the checkpoint's own tokenizer code may run
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.tokenizer_dir, local_files_only=True,
            trust_remote_code=_param(cfg, "trust_remote_code", "false").lower() == "true")
        self.add_special_tokens = _param(cfg, "add_special_tokens", "false").lower() == "true"
        self.max_input_len = int(_param(cfg, "max_input_len"))
        self.max_seq_len = int(_param(cfg, "max_seq_len"))
        self.end_id = int(_param(cfg, "end_id"))
        self.pad_id = int(_param(cfg, "pad_id"))
        # generation_config.json's other eos ids: one-token stop words, so every runtime (the C++
        # backend takes a single end_id) stops on all of them. A client's end_id that is one of the model's
        # end ids keeps the others (Llama 3 ends turns on several); any other end_id replaces them (a deliberate
        # choice, e.g. an id never generated so that the output runs to max_tokens).
        self.stop_token_ids = [int(t) for t in (_param(cfg, "stop_token_ids", "") or "").split(",") if t.strip()]

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            return pb_utils.InferenceResponse(output_tensors=self._tensors(request))
        except ValueError as exc:
            return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc)))

    def _tensors(self, request):
        query, out_len = (_required(request, name).as_numpy().reshape(-1) for name in ("QUERY", "REQUEST_OUTPUT_LEN"))
        texts = [_text(q, FIELDS["QUERY"]) for q in query]
        ids = []
        for i, text in enumerate(texts):
            if not text.strip():
                raise ValueError(f"{FIELDS['QUERY']} is empty: send a non-empty prompt")
            toks = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
            if len(toks) > self.max_input_len:
                raise ValueError(f"{FIELDS['QUERY']}: the prompt is {len(toks)} tokens, above max_input_len "
                                 f"{self.max_input_len}: shorten it or rebuild with a larger limits.max_input_len")
            max_tokens = int(out_len[min(i, len(out_len) - 1)])
            if max_tokens < 1:
                raise ValueError(f"{FIELDS['REQUEST_OUTPUT_LEN']} = {max_tokens}: must be at least 1")
            if len(toks) + max_tokens > self.max_seq_len:
                raise ValueError(f"prompt ({len(toks)} tokens) + {FIELDS['REQUEST_OUTPUT_LEN']} ({max_tokens}) exceeds "
                                 f"max_seq_len {self.max_seq_len}: set max_tokens <= {self.max_seq_len - len(toks)}")
            ids.append(toks)
        width = max(len(t) for t in ids)
        input_ids = np.full((len(ids), width), self.pad_id, dtype=np.int32)
        for i, t in enumerate(ids):
            input_ids[i, :len(t)] = t
        lengths = np.asarray([[len(t)] for t in ids], dtype=np.int32)
        batch = len(ids)

        sent = pb_utils.get_input_tensor_by_name(request, "END_ID")
        client_end_id = None if sent is None else int(sent.as_numpy().reshape(-1)[0])
        model_end_ids = [self.end_id] + self.stop_token_ids
        if client_end_id is None:
            extra_end_ids = self.stop_token_ids
        elif client_end_id in model_end_ids:
            extra_end_ids = [t for t in model_end_ids if t != client_end_id]
        else:
            extra_end_ids = ()

        def words(name, extra_ids=()):
            t = pb_utils.get_input_tensor_by_name(request, name)
            rows = [[]] * batch if t is None else [list(r.reshape(-1)) for r in t.as_numpy().reshape(batch, -1)]
            return _pack_words(self.tokenizer, rows, extra_ids, FIELDS[name])

        def scalar(name, default):
            t = pb_utils.get_input_tensor_by_name(request, name)
            v = default if t is None else int(t.as_numpy().reshape(-1)[0])
            return np.full((batch, 1), v, dtype=np.int32)

        def rows(name):
            t = pb_utils.get_input_tensor_by_name(request, name)
            return None if t is None else [list(r.reshape(-1)) for r in t.as_numpy().reshape(batch, -1)]

        bias = _embedding_bias(self.tokenizer, rows("EMBEDDING_BIAS_WORDS"), rows("EMBEDDING_BIAS_WEIGHTS"),
                               len(self.tokenizer))
        return [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
            # decoder-only models: no decoder input (upstream sends pad_id with length 0)
            pb_utils.Tensor("DECODER_INPUT_ID", np.full((batch, 1), self.pad_id, dtype=np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.zeros((batch, 1), dtype=np.int32)),
            pb_utils.Tensor("EMBEDDING_BIAS", np.zeros((batch, 0), dtype=np.float32) if bias is None else bias),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len.reshape(batch, 1).astype(np.int32)),
            pb_utils.Tensor("BAD_WORDS_IDS", words("BAD_WORDS_DICT")),
            pb_utils.Tensor("STOP_WORDS_IDS", words("STOP_WORDS_DICT", extra_end_ids)),
            pb_utils.Tensor("OUT_END_ID", scalar("END_ID", self.end_id)),
            pb_utils.Tensor("OUT_PAD_ID", scalar("PAD_ID", self.pad_id)),
        ]
