# --- request helpers shared by the Python-backend `tensorrt_llm` models (spliced at package time
# from model_repo/templates/_request_helpers.py; needs numpy as np and pb_utils imported above).
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _param(cfg, key, default=None):
    """A config.pbtxt string parameter; ``default`` when absent, empty or an unfilled ${...}."""
    value = cfg.get("parameters", {}).get(key, {}).get("string_value", None)
    if value is None or value == "" or value.startswith("${"):
        return default
    return value


def _opt_scalar(request, name, default=None):
    """First element of an optional request input as a Python scalar; ``default`` when absent or empty."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return default
    arr = t.as_numpy()
    return default if arr.size == 0 else arr.reshape(-1)[0].item()


def _prompt_ids(request):
    """The request's prompt: input_ids (INT32 [1, -1] or [-1]) cut to input_lengths, as a list of ints."""
    ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
    n = int(_opt_scalar(request, "input_lengths", ids.size))
    return [int(x) for x in ids[:n]]


def _words(request, name, b=0, batch=1):
    """stop_words_list / bad_words_list entry ``b`` of a request of ``batch`` ([B, 2, L] or [2, L]: token ids,
    then end offsets padded with -1; the backend's layout) as a list of token-id lists."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return []
    arr = t.as_numpy()
    arr = arr.reshape(-1, 2, arr.shape[-1])
    arr = arr[b] if arr.shape[0] == batch else arr[0]
    words, start = [], 0
    for end in [int(o) for o in arr[1].tolist() if o >= 0]:
        if end > start:
            words.append([int(x) for x in arr[0][start:end].tolist()])
        start = end
    return words


def _output_dtypes(cfg):
    """numpy dtype of each output the model's config declares (its data_type), so responses match it."""
    return {o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in cfg.get("output", [])}


def _perf_tensors(dtypes, values):
    """The return_perf_metrics outputs ([1, 1] each) in the dtypes the config declares for them (the C++
    backend's: INT32 block and draft counts, INT64 times, FP32 acceptance_rate); names it lacks are skipped."""
    return [pb_utils.Tensor(name, np.asarray([[value]], dtype=dtypes[name])) for name, value in values.items()
            if name in dtypes]
# --- end of request helpers
