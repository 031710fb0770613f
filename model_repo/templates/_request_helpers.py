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
# --- end of request helpers
