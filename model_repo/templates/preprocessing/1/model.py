# The `preprocessing` model: text -> token ids, with the engine's limits enforced per request
# (TensorRT-LLM backend interface: all_models/inflight_batcher_llm/preprocessing).

# @@BOOTSTRAP@@ (replaced at package time by templates/_bootstrap.py: sys.path set-up)

import numpy as np
import triton_python_backend_utils as pb_utils


def _param(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", None)
    return default if value in (None, "") else value


def _pack_words(tokenizer, rows, extra_ids=()):
    """Words per batch row -> TensorRT-LLM's [B, 2, L] list: flat ids, then end offsets (-1 padded).
    ``extra_ids`` are token ids added to every row as one-token words (the tokenizer's other stop ids)."""
    flats, offsets = [], []
    for words in rows:
        ids, offs = [], []
        for tok in extra_ids:
            ids.append(int(tok))
            offs.append(len(ids))
        for w in words:
            w = w.decode() if isinstance(w, bytes) else str(w)
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
        words = [w.decode() if isinstance(w, bytes) else str(w) for w in words]
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
        from transformers import AutoTokenizer

        cfg = _json.loads(args["model_config"])
        self.tokenizer_dir = _param(cfg, "tokenizer_dir")
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir, local_files_only=True)
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
        query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy().reshape(-1)
        out_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy().reshape(-1)
        texts = [q.decode("utf-8") if isinstance(q, bytes) else str(q) for q in query]
        ids = []
        for i, text in enumerate(texts):
            if not text.strip():
                raise ValueError("text_input is empty: send a non-empty prompt")
            toks = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
            if len(toks) > self.max_input_len:
                raise ValueError(f"prompt is {len(toks)} tokens, above max_input_len {self.max_input_len}: "
                                 "shorten it or rebuild with a larger limits.max_input_len")
            max_tokens = int(out_len[min(i, len(out_len) - 1)])
            if max_tokens < 1:
                raise ValueError(f"max_tokens = {max_tokens}: must be at least 1")
            if len(toks) + max_tokens > self.max_seq_len:
                raise ValueError(f"prompt ({len(toks)} tokens) + max_tokens ({max_tokens}) exceeds max_seq_len "
                                 f"{self.max_seq_len}: set max_tokens <= {self.max_seq_len - len(toks)}")
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
            return _pack_words(self.tokenizer, rows, extra_ids)

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
