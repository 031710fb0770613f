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
# --- end of request helpers
