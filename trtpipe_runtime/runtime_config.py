"""The portable ``pytorch`` runtime's continuous-batching settings, from the ``tensorrt_llm`` model's parameters.

One function for the served model (tensorrt_llm_pytorch/1/model.py and engine_worker.py) and for anything that
drives the same runtime in-process (scripts/bench/bench_h200.py), so both run with exactly the same
ContinuousBatchingConfig. Standard library at import; transformers and torch inside the functions that need them.
"""

from .params import flag as _flag


def runtime_settings(params, build_config):
    """The runtime's settings from the tensorrt_llm model's string parameters and the engine limits.

    ``params`` maps parameter names to strings (missing or empty = the engine's value or the
    library default); ``build_config`` is engine.json's build_config. Returns plain values:
    max_batch_size, max_input_len, max_seq_len, max_num_tokens, tokens_per_block, num_blocks,
    max_queue_size, allow_block_sharing, use_cuda_graph, use_async_batching, library_defaults,
    sdpa_backends (a list of SDPA_BACKENDS names, or None for torch's own choice), trust_remote_code (the build
    file's model.trust_remote_code: whether the model load may run the checkpoint's own code; missing: false).

    Raises ValueError for async_batching true, an unknown sdpa_backends name, or no
    max_tokens_in_paged_kv_cache.
    """
    def get(key, default=None):
        value = params.get(key)
        return default if value is None or value == "" or str(value).startswith("${") else value

    s = {k: int(get(k, build_config[k])) for k in
         ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block")}
    # The KV slots are the repository's (the generator writes them by plugins/runtimes.py kv_slots, the one rule).
    kv_tokens = get("max_tokens_in_paged_kv_cache")
    if not kv_tokens:
        raise ValueError("max_tokens_in_paged_kv_cache is missing from the tensorrt_llm model's parameters: "
                         "regenerate the repository with `trtpipe build`")
    kv_tokens = int(kv_tokens)
    s["num_blocks"] = max(1, -(-kv_tokens // s["tokens_per_block"]))
    s["max_queue_size"] = int(get("max_queue_size", "0"))
    s["allow_block_sharing"] = _flag(get("enable_kv_cache_reuse"), False)
    s["trust_remote_code"] = _flag(get("trust_remote_code"), False)
    s["use_cuda_graph"] = _flag(get("cuda_graph_mode"), None)
    # Synchronous batching always: the per-request sampling processors (tensorrt_llm_pytorch/1/sampling.py)
    # prepare and consume one batch's arguments before the next batch is prepared.
    if _flag(get("async_batching"), False):
        raise ValueError("async_batching = true: the pytorch runtime's per-request sampling needs synchronous "
                         "batching; set it to false")
    s["use_async_batching"] = False
    # "true": let transformers size everything itself (KV share of free memory, block size, batch
    # token budget, CUDA graphs, async batching) -- the baseline the planner's choice is measured against.
    s["library_defaults"] = _flag(get("library_defaults"), False)
    # The scaled-dot-product-attention kernels torch may pick (torch.backends.cuda.enable_*_sdp); empty or
    # "auto": torch's own priority. Process-wide, so set where the generation loop runs.
    names = [n.strip() for n in str(get("sdpa_backends", "auto")).split(",") if n.strip()]
    if names in ([], ["auto"]):
        s["sdpa_backends"] = None
    else:
        bad = [n for n in names if n not in SDPA_BACKENDS]
        if bad:
            raise ValueError(f"sdpa_backends = {','.join(names)!r}: unknown {bad}; use 'auto' or a comma list of "
                             f"{', '.join(SDPA_BACKENDS)}")
        s["sdpa_backends"] = names
    return s


SDPA_BACKENDS = ("flash", "mem_efficient", "math", "cudnn")
"""torch.nn.functional.scaled_dot_product_attention backends, by the names of torch.backends.cuda.enable_<name>_sdp."""


def apply_sdpa_backends(settings):
    """Enable exactly ``settings["sdpa_backends"]`` (process-wide torch flags); None leaves torch's choice.
    Returns the enabled backends as torch reports them."""
    import torch

    chosen = settings.get("sdpa_backends")
    for name in SDPA_BACKENDS:
        enable = getattr(torch.backends.cuda, f"enable_{name}_sdp", None)
        if chosen is not None and enable is not None:
            enable(name in chosen)
    return [n for n in SDPA_BACKENDS if getattr(torch.backends.cuda, f"{n}_sdp_enabled", lambda: False)()]


def continuous_batching_config(settings):
    """transformers' ContinuousBatchingConfig for ``settings`` (from :func:`runtime_settings`).

    transformers 5.17 names the block size ``block_size``, 5.24 ``page_size``: the field the
    installed version declares is used.
    """
    import dataclasses

    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    # per_request_processors: each request carries its own temperature/top_k/top_p (sampling.py).
    kw = {"max_queue_size": settings["max_queue_size"], "per_request_processors": True,
          "use_async_batching": False}  # also with library_defaults: sampling.py needs synchronous batching
    if not settings.get("library_defaults"):
        kw.update(num_blocks=settings["num_blocks"], max_batch_tokens=settings["max_num_tokens"],
                  max_requests_per_batch=settings["max_batch_size"],
                  allow_block_sharing=settings["allow_block_sharing"],
                  use_cuda_graph=settings["use_cuda_graph"])
        kw["page_size" if "page_size" in fields else "block_size"] = settings["tokens_per_block"]
    return ContinuousBatchingConfig(**{k: v for k, v in kw.items() if k in fields})
