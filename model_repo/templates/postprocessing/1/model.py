# The `postprocessing` model: token ids -> text
# (TensorRT-LLM backend interface: all_models/inflight_batcher_llm/postprocessing).
# Also returns NUM_OUTPUT_TOKENS, the tokens each response carries, so clients count tokens
# from the server instead of re-tokenizing text.

# @@BOOTSTRAP@@ (replaced at package time by templates/_bootstrap.py: sys.path set-up)

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        cfg = _json.loads(args["model_config"])
        params = cfg.get("parameters", {})
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"]["string_value"], local_files_only=True)
        self.skip_special = params.get("skip_special_tokens", {}).get("string_value", "true").lower() == "true"

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            if tokens.ndim == 2:  # [beams, len] without the batch dim
                tokens = tokens[None]
            lengths = lengths.reshape(tokens.shape[0], -1)
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
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", out), pb_utils.Tensor("NUM_OUTPUT_TOKENS", cnt)]))
        return responses
