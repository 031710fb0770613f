"""Request tensors -> Python values, for the Python-backend ``tensorrt_llm`` models (TensorRT-LLM's Triton tensor
layout: all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt). Imports numpy and the stub's
``triton_python_backend_utils``: only a served model imports this module (after
:func:`trtpipe_runtime.bootstrap.set_up_sys_path`).
"""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

ERROR_APART = "trtpipe_error_apart"
"""The request parameter (bool) by which tensorrt_llm_bls tells the portable runtime it is the caller: a mid-stream
error then ends its stream with a bare final flag (Triton 2.51 loses such an error on the way to a BLS caller, and
one sent without the final flag leaves the BLS model unable to unload), and the BLS asks `tensorrt_llm` why. Other
callers (the ensemble, clients) get error and final flag in one response: sent apart, the ensemble never releases
its request, and tritonserver then waits out its exit timeout at stop and crashes."""


def opt_scalar(request, name, default=None):
    """First element of an optional request input as a Python scalar; ``default`` when absent or empty."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return default
    arr = t.as_numpy()
    return default if arr.size == 0 else arr.reshape(-1)[0].item()


def prompt_ids(request):
    """The request's prompt: input_ids (INT32 [1, -1] or [-1]) cut to input_lengths, as a list of ints."""
    ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
    n = int(opt_scalar(request, "input_lengths", ids.size))
    return [int(x) for x in ids[:n]]


def words(request, name, b=0, batch=1):
    """stop_words_list / bad_words_list entry ``b`` of a request of ``batch`` ([B, 2, L] or [2, L]: token ids,
    then end offsets padded with -1; the backend's layout) as a list of token-id lists."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return []
    arr = t.as_numpy()
    arr = arr.reshape(-1, 2, arr.shape[-1])
    arr = arr[b] if arr.shape[0] == batch else arr[0]
    out, start = [], 0
    for end in [int(o) for o in arr[1].tolist() if o >= 0]:
        if end > start:
            out.append([int(x) for x in arr[0][start:end].tolist()])
        start = end
    return out


def output_dtypes(cfg):
    """numpy dtype of each output the model's config declares (its data_type), so responses match it."""
    return {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in cfg.get("output", [])}


def perf_tensors(dtypes, values):
    """The return_perf_metrics outputs ([1, 1] each) in the dtypes the config declares for them (the C++
    backend's: INT32 block and draft counts, INT64 times, FP32 acceptance_rate); names it lacks are skipped."""
    return [pb_utils.Tensor(name, np.asarray([[value]], dtype=dtypes[name])) for name, value in values.items()
            if name in dtypes]
