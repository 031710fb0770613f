# The `tensorrt_llm_bls` model: preprocessing -> tensorrt_llm -> postprocessing through BLS calls
# (TensorRT-LLM backend interface: all_models/inflight_batcher_llm/tensorrt_llm_bls).
# Each client request runs in its own thread: the tokenizer is called once, tensorrt_llm is called
# with exec(decoupled=True) and every one of its responses is detokenized and sent on at once.
# A client that cancels stops the stream (and the tensorrt_llm request with it).

# @@BOOTSTRAP@@ (replaced at package time by templates/_bootstrap.py: sys.path set-up)

import threading

import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# client tensor -> preprocessing tensor
PRE_INPUTS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
              "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID",
              "embedding_bias_words": "EMBEDDING_BIAS_WORDS", "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS"}
# preprocessing output -> tensorrt_llm input
PRE_TO_LLM = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths", "REQUEST_OUTPUT_LEN": "request_output_len",
              "BAD_WORDS_IDS": "bad_words_list", "STOP_WORDS_IDS": "stop_words_list", "OUT_END_ID": "end_id",
              "OUT_PAD_ID": "pad_id", "EMBEDDING_BIAS": "embedding_bias"}


def _param(cfg, key):
    return cfg.get("parameters", {}).get(key, {}).get("string_value", "")


class TritonPythonModel:
    def initialize(self, args):
        cfg = _json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.runtime_inputs = dict(pair.split(":") for pair in _param(cfg, "runtime_input_names").split(",") if pair)
        self.pass_outputs = [n for n in _param(cfg, "runtime_output_names").split(",") if n]
        self.threads = set()
        self.lock = threading.Lock()

    def execute(self, requests):
        if not self.decoupled:
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                "tensorrt_llm_bls streams through decoupled responses: regenerate with serving.streaming: true"))
                for _ in requests]
        for request in requests:
            t = threading.Thread(target=self._run, args=(request, request.get_response_sender()), daemon=True)
            with self.lock:
                self.threads.add(t)
            t.start()
        return None

    def _run(self, request, sender):
        try:
            self._generate(request, sender)
        except Exception as exc:  # every failure goes back to the client that caused it
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                        flags=FINAL)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    @staticmethod
    def _call(model, inputs, outputs):
        resp = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs).exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        return resp

    @staticmethod
    def _stop(inner_id, stream):
        """Stop the tensorrt_llm request this BLS request started: the response iterator's cancel() where
        the Python backend has it (not in Triton 2.51), else a `stop` request with the same request id
        (the TensorRT-LLM backend's way, which the pytorch runtime implements too)."""
        if hasattr(stream, "cancel"):
            stream.cancel()
            return
        one = np.zeros((1, 1), dtype=np.int32)
        stop = [pb_utils.Tensor("input_ids", one), pb_utils.Tensor("input_lengths", one + 1),
                pb_utils.Tensor("request_output_len", one + 1), pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool))]
        try:
            for _ in pb_utils.InferenceRequest(model_name="tensorrt_llm", inputs=stop, request_id=inner_id,
                                               requested_output_names=["output_ids"]).exec(decoupled=True):
                pass
        except Exception as exc:  # a runtime without `stop`: the request runs to its end
            pb_utils.Logger.log_warn(f"tensorrt_llm_bls: could not stop {inner_id}: {exc}")

    def _generate(self, request, sender):
        pre_in = [pb_utils.Tensor(dst, t.as_numpy()) for src, dst in PRE_INPUTS.items()
                  if (t := pb_utils.get_input_tensor_by_name(request, src)) is not None]
        pre = self._call("preprocessing", pre_in, list(PRE_TO_LLM))
        llm_in = [pb_utils.Tensor(dst, pb_utils.get_output_tensor_by_name(pre, src).as_numpy())
                  for src, dst in PRE_TO_LLM.items()]
        for src, dst in self.runtime_inputs.items():
            t = pb_utils.get_input_tensor_by_name(request, src)
            if t is not None:
                llm_in.append(pb_utils.Tensor(dst, t.as_numpy()))
        inner_id = uuid.uuid4().hex
        stream = pb_utils.InferenceRequest(
            model_name="tensorrt_llm", inputs=llm_in, request_id=inner_id,
            requested_output_names=["output_ids", "sequence_length"] + self.pass_outputs).exec(decoupled=True)
        sent_final = False
        for resp in stream:
            if sender.is_cancelled():
                self._stop(inner_id, stream)
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    "request cancelled")), flags=FINAL)
                for _ in stream:  # read the inner stream to its final response (the stopped request's error):
                    pass          # a BLS model with an unread stream never unloads, so the server cannot stop
                return
            if resp.has_error():
                raise RuntimeError(resp.error().message())
            ids = pb_utils.get_output_tensor_by_name(resp, "output_ids")
            if ids is None:  # the empty final response of a decoupled stream
                continue
            lengths = pb_utils.get_output_tensor_by_name(resp, "sequence_length")
            post = self._call("postprocessing", [pb_utils.Tensor("TOKENS_BATCH", ids.as_numpy()),
                                                 pb_utils.Tensor("SEQUENCE_LENGTH", lengths.as_numpy())],
                              ["OUTPUT", "NUM_OUTPUT_TOKENS"])
            out = [pb_utils.Tensor("text_output", pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy()),
                   pb_utils.Tensor("num_output_tokens",
                                   pb_utils.get_output_tensor_by_name(post, "NUM_OUTPUT_TOKENS").as_numpy())]
            for name in self.pass_outputs:
                t = pb_utils.get_output_tensor_by_name(resp, name)
                if t is not None:
                    out.append(pb_utils.Tensor(name, t.as_numpy()))
            sender.send(pb_utils.InferenceResponse(output_tensors=out))
        if not sent_final:
            sender.send(flags=FINAL)

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=5)
