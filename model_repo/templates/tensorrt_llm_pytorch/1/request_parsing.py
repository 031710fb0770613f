"""Request parsing of the portable runtime's `tensorrt_llm` model: one Triton request (input tensors, possibly
a batch of prompts) -> the validated rows the engine gets; any problem is a RequestError naming the input, the
value and the fix, sent to that request only. The decoding options are every runtime's rules
(trtpipe_runtime.decoding, through sampling.parse_params)."""

import numpy as np
import triton_python_backend_utils as pb_utils

import sampling
from trtpipe_runtime.grammar import parse_guide
from trtpipe_runtime.triton_io import words as _words


def _row(arr, b, batch):
    """Row ``b`` of a batched input (first dim ``batch``), or the input itself when it was sent once."""
    arr = np.asarray(arr)
    return arr.reshape(batch, -1)[b] if arr.ndim and arr.shape[0] == batch and batch > 1 else arr.reshape(-1)


def _row_scalar(request, name, b, batch, default=None):
    """Entry ``b`` of an optional scalar input as a Python scalar; ``default`` when absent or empty."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return default
    value = _row(t.as_numpy(), b, batch)[0]
    return value.item() if hasattr(value, "item") else value  # a STRING input's entry is bytes already


class RequestError(ValueError):
    """A per-request validation error: sent to that request only; the server keeps serving."""



class RequestParsing:
    """What TritonPythonModel uses to read a request (mixed in: the engine limits are its attributes)."""

    def _parse_row(self, request, ids_t, b, batch):
        """Validate entry ``b`` of a request: its prompt, limits and decoding options (every input is read at
        row ``b``; an input sent once applies to every row). Raises RequestError / SamplingError."""
        def get(name, default=None):
            return _row_scalar(request, name, b, batch, default)

        where = f" (batch entry {b})" if batch > 1 else ""
        input_len = int(get("input_lengths", ids_t.shape[-1]))
        ids = ids_t[b, :input_len].astype(np.int64).tolist()
        max_new = int(get("request_output_len", 0))
        if input_len <= 0 or not ids:
            raise RequestError(f"input_ids is empty{where} (input_lengths = {input_len}): the prompt must hold at "
                               "least one token")
        if input_len > ids_t.shape[-1]:
            raise RequestError(f"input_lengths = {input_len}{where} but input_ids holds {ids_t.shape[-1]} ids: send "
                               "the number of prompt tokens in input_ids")
        if input_len > self.max_input_len:
            raise RequestError(f"input_ids: the prompt has {input_len} tokens{where}, above the engine's "
                               f"max_input_len {self.max_input_len}: shorten the prompt")
        if max_new <= 0:
            raise RequestError(f"request_output_len (max_tokens) = {max_new}{where}: must be at least 1")
        if input_len + max_new > self.max_seq_len:
            raise RequestError(f"prompt ({input_len} tokens) + request_output_len (max_tokens) {max_new} = "
                               f"{input_len + max_new}{where} exceeds the engine's max_seq_len {self.max_seq_len}: "
                               f"lower max_tokens to at most {self.max_seq_len - input_len}")
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise RequestError(f"input_ids holds token id {max(ids) if max(ids) >= self.vocab_size else min(ids)}"
                               f"{where}, outside the vocabulary [0, {self.vocab_size}): send ids the model's "
                               "tokenizer gives")
        beam_width = int(get("beam_width", 1))
        if beam_width != 1:
            raise RequestError(f"beam_width = {beam_width}: the pytorch runtime has no beam search (transformers' "
                               "continuous batching samples one token per sequence); send beam_width 1, or use "
                               "num_return_sequences with sampling for several answers")
        n_seq = int(get("num_return_sequences", 1))
        if not 1 <= n_seq <= self.max_batch_size:
            raise RequestError(f"num_return_sequences = {n_seq}: must be between 1 and max_batch_size "
                               f"{self.max_batch_size}")
        end_id = get("end_id", None)
        if end_id is not None and end_id < -1:
            raise RequestError(f"end_id = {end_id}{where}: must be a token id >= 0, or -1 for none (an id the model "
                               "never generates, -1 or vocab_size, lets the answer run to max_tokens)")
        end_ids = sampling.request_end_ids(end_id, self.default_end_ids)
        exclude = bool(get("exclude_input_in_output", self.exclude_input_default))
        stop_ids = self._word_ids(request, "stop_words_list", b, batch, where)
        # One-token stop words that are end ids of the model (preprocessing sends generation_config.json's
        # other eos ids that way) are end ids here: dropped from the output and held back by min_tokens.
        end_ids += [w[0] for w in stop_ids if len(w) == 1 and w[0] in self.default_end_ids and w[0] not in end_ids]
        stop_ids = [w for w in stop_ids if not (len(w) == 1 and w[0] in end_ids)]
        bias = pb_utils.get_input_tensor_by_name(request, "embedding_bias")
        bias = None if bias is None else _row(bias.as_numpy(), b, batch)
        guide = parse_guide(get("guided_decoding_guide_type"), get("guided_decoding_guide"))
        if guide is not None and not self.guided_backend:
            raise RequestError("guided_decoding_guide_type: guided decoding is off in this build "
                               "(serving.guided_decoding_backend: null); rebuild with serving.guided_decoding_backend: "
                               "xgrammar, or send no guide")
        params = sampling.parse_params(get, end_ids=end_ids, max_new_tokens=max_new,
                                       bad_words=self._word_ids(request, "bad_words_list", b, batch, where),
                                       embedding_bias=bias,
                                       vocab_size=self.vocab_size, guide=guide)
        params.lora_task_id = self._lora_task_id(request, get, where)
        if n_seq > 1 and params.greedy:
            raise RequestError(f"num_return_sequences = {n_seq} with greedy decoding gives {n_seq} identical "
                               "answers: also send top_k > 1 or top_p > 0 (a temperature alone is greedy)")
        return {"ids": ids, "max_new": max_new, "n_seq": n_seq, "end_ids": end_ids, "exclude": exclude,
                "stop_ids": stop_ids, "params": params}

    def _lora_task_id(self, request, get, where):
        """The row's lora_task_id (0: the base model); RequestError for one the build does not serve."""
        task_id = int(get("lora_task_id", 0) or 0)
        if task_id and task_id not in self.lora_names:
            served = ", ".join(f"{t} ({n})" for t, n in sorted(self.lora_names.items())) or "none"
            raise RequestError(f"lora_task_id = {task_id}{where} is not served (adapters of this build: {served}); "
                               "send one of those, or 0 for the base model")
        return task_id

    def _word_ids(self, request, name, b, batch, where):
        """stop_words_list / bad_words_list entry ``b`` as token-id lists; RequestError for an id outside the
        vocabulary (a bad word's id there would stop the generation loop: the library's ban raises on it)."""
        words = _words(request, name, b, batch)
        bad = [t for w in words for t in w if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"{name} holds token id {bad[0]}{where}, outside the vocabulary [0, "
                               f"{self.vocab_size}): send the ids of the words (preprocessing builds the list)")
        return words

