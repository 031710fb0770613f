# The `postprocessing` model: token ids -> text
# (TensorRT-LLM backend interface: all_models/inflight_batcher_llm/postprocessing).
# Also returns NUM_OUTPUT_TOKENS, the tokens each response carries, so clients count tokens
# from the server instead of re-tokenizing text.
# A streamed request reaches this model once per response with only its new tokens; a character whose UTF-8
# bytes span two responses would come out as U+FFFD. Requests that carry a request id (the ensemble passes the
# client's on) are detokenized incrementally: each id keeps an IncrementalDetokenizer (trtpipe_runtime/
# detokenize.py) for STATE_TTL_S after its last response, so a split character is sent whole with the response
# that completes it. A request without an id is decoded on its own, as upstream's postprocessing does.

import json as _json
import os as _os
import sys as _sys
import threading as _threading
import time as _time
from collections import OrderedDict as _OrderedDict

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpipe_runtime.detokenize import IncrementalDetokenizer
from trtpipe_runtime.lifeline import watch_parent

STATE_TTL_S = 300.0
"""How long a request id's detokenizer outlives its last response (the model never sees a stream's end)."""
STATE_MAX = 4096
"""Most request ids kept at once; the least recently used goes first."""


def _check(tokens, lengths):
    """ValueError naming the input when SEQUENCE_LENGTH does not give one length per sequence of TOKENS_BATCH
    ([batch, beams, len]) within its length, or a token id is negative (the tokenizer cannot decode it)."""
    batch, beams, width = tokens.shape
    if lengths.size != batch * beams:
        raise ValueError(f"SEQUENCE_LENGTH holds {lengths.size} lengths for the {batch} x {beams} sequences of "
                         f"TOKENS_BATCH {list(tokens.shape)}: send one length per sequence")
    if lengths.size and (lengths.min() < 0 or lengths.max() > width):
        bad = int(lengths.min() if lengths.min() < 0 else lengths.max())
        raise ValueError(f"SEQUENCE_LENGTH = {bad}: must be between 0 and the {width} tokens of each TOKENS_BATCH "
                         "sequence")
    if tokens.size and tokens.min() < 0:
        raise ValueError(f"TOKENS_BATCH holds token id {int(tokens.min())}: token ids are >= 0")


class TritonPythonModel:
    def initialize(self, args):
        watch_parent(f"the {args.get('model_name', 'model')} stub")  # ends when tritonserver does, even killed
        from transformers import AutoTokenizer

        cfg = _json.loads(args["model_config"])
        params = cfg.get("parameters", {})
        # model.trust_remote_code of the build file: whether the checkpoint's own tokenizer code may run
        trust = params.get("trust_remote_code", {}).get("string_value", "false").lower() == "true"
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"], local_files_only=True,
                                                       trust_remote_code=trust)
        self.skip_special = params.get("skip_special_tokens", {}).get("string_value", "true").lower() == "true"
        self.streams = _OrderedDict()  # request id -> (IncrementalDetokenizer, time of its last response)
        self.streams_lock = _threading.Lock()

    def _batch_decode(self, windows):
        return self.tokenizer.batch_decode(windows, skip_special_tokens=self.skip_special)

    def _detokenizer(self, request_id):
        """The request id's IncrementalDetokenizer (a new one for an id not seen within STATE_TTL_S)."""
        now = _time.monotonic()
        with self.streams_lock:
            while self.streams and (len(self.streams) >= STATE_MAX
                                    or now - next(iter(self.streams.values()))[1] > STATE_TTL_S):
                self.streams.popitem(last=False)
            detok = self.streams.pop(request_id, (None, 0.0))[0] or IncrementalDetokenizer(self._batch_decode)
            self.streams[request_id] = (detok, now)
            return detok

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except ValueError as exc:  # this request's error; the others of the batch are answered
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        return responses

    def _one(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        if tokens.ndim == 2:  # [beams, len] without the batch dim
            tokens = tokens[None]
        _check(tokens, lengths)
        lengths = lengths.reshape(tokens.shape[0], -1)
        request_id = request.request_id()
        if request_id and tokens.shape[:2] == (1, 1):  # one streamed sequence: continue its text
            n = int(lengths[0, 0])
            text = self._detokenizer(request_id).push(tokens[0, 0, :n].tolist())
            return pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.array([text.encode("utf-8")], dtype=object)),
                pb_utils.Tensor("NUM_OUTPUT_TOKENS", np.asarray([n], dtype=np.int32))])
        texts, counts = [], []
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                n = int(lengths[b, beam])
                ids = tokens[b, beam, :n].tolist()
                texts.append(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special).encode("utf-8"))
                counts.append(n)
        # flat, batch x beam strings in order, as upstream's postprocessing returns them (its clients
        # read text_output[0].decode()); NUM_OUTPUT_TOKENS alike
        out = np.array(texts, dtype=object)
        cnt = np.asarray(counts, dtype=np.int32)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT", out), pb_utils.Tensor("NUM_OUTPUT_TOKENS", cnt)])
