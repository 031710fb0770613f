"""Why a server did not start: :class:`ServerError`, the log patterns with their fixes (tritonserver's
:data:`KNOWN_FAILURES`, trtllm-serve's :data:`TRTLLM_SERVE_FAILURES`) and :func:`diagnose`, which matches a log
against them."""

from __future__ import annotations

from plugins.errors import PipelineError
from plugins.runtimes import openai_server_releases

_LEAST = openai_server_releases().first_text


class ServerError(PipelineError):
    """The server did not start, or a model did not become READY."""


# Log patterns -> what to do about them.
KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    ("address already in use", "another process holds the port: stop it (`trtpipe stop`) or pass --http-port/"
                               "--grpc-port/--metrics-port"),
    ("needs TensorRT-LLM", "this repository is for a GPU host with TensorRT-LLM (runtime trtllm-llmapi): serve it "
                           "there as its deploy/README.md says; here, build with --runtime pytorch"),
    ("No module named", "the Python models cannot import a package: run `make setup`, or set "
                        "TRTPIPE_PYTHONPATH to the site-packages folder holding torch/transformers/numpy<2"),
    ("cannot reshape array of size 0", "numpy 2.x reached the Python-backend stub: put numpy<2 first on "
                                       "TRTPIPE_PYTHONPATH"),
    ("gpt_model_path", "the engine folder named in tensorrt_llm/config.pbtxt is missing or incomplete: rebuild"),
    ("sdpa_backends =", "tensorrt_llm/config.pbtxt's sdpa_backends names an unknown attention kernel: use the "
                        "names the error lists, or 'auto' (docs/deploy.md)"),
    ("lib-dynload", "the Python-backend stub loaded another Python's standard library (an embedded "
                    "interpreter takes its prefix from the first python3 on PATH): put the python3 whose "
                    "libpython the stub uses first on PATH, or set PYTHONHOME to its prefix"),
    ("unable to create stub process", "the Python-backend stub could not start: check /dev/shm space (>= 64 MB "
                                      "per Python model instance) and that libpython of this Python is present"),
    ("failed to increase the shared memory pool size", "too little /dev/shm: mount a larger one "
                                                        "(docker: --shm-size=2g)"),
    ("out of memory", "the model or its KV pool does not fit: lower limits.max_batch_size/max_seq_len or "
                      "serving.max_tokens_in_paged_kv_cache"),
    ("Unknown logit_processor_kwargs", "the runtime's sampling processors and transformers disagree: regenerate "
                                       "the repository with this checkout (`trtpipe build`) and pin transformers"),
    ("no CUDA-capable device", "no GPU visible to the server: check CUDA_VISIBLE_DEVICES and the container's "
                               "--gpus / nvidia.com/gpu request"),
    ("CUDA driver version is insufficient", "the host driver is older than the container's CUDA: use the "
                                            "container release that matches the driver (NVIDIA's support matrix)"),
    ("Failed to deserialize cuda engine", "the engine was built by another TensorRT/TensorRT-LLM version than "
                                          "this server's: rebuild in the serving container's version"),
    ("MPI_Init", "the tensorrtllm backend runs under MPI: launch with `trtpipe serve` (mpirun, one rank per GPU)"),
    ("ORTE_ERROR_LOG", "mpirun could not start the ranks: run as a user mpirun allows (--allow-run-as-root "
                       "in containers) and check that every rank can see its GPU"),
    ("Unexpected inference output", "a model returned a tensor its config.pbtxt does not declare: regenerate "
                                    "the repository so templates and configs come from the same checkout"),
    ("model_transaction_policy", "decoupled setting and the model disagree: streaming needs decoupled: true "
                                 "(serving.streaming) and gRPC streaming or generate_stream on the client"),
)


# trtllm-serve's log patterns -> what to do about them; each is the message of the component named in the fix
# (uvicorn's bind error, torch/CUDA's runtime errors, Python's import error, click's usage error, pydantic's
# extra='forbid' error of TorchLlmArgs: tests/facts/trtllm_1_2_1/llm_args.json torch_refuses_extra_how).
TRTLLM_SERVE_FAILURES: tuple[tuple[str, str], ...] = (
    ("address already in use", "another process holds the HTTP port (uvicorn could not bind it): stop it "
                               "(`trtpipe stop`) or pass --http-port"),
    ("out of memory", "the checkpoint or its KV cache does not fit the GPU memory (CUDA out of memory): lower "
                      "serving.kv_cache_free_gpu_mem_fraction or limits.max_batch_size/max_num_tokens, or raise "
                      "parallelism.tp_size, and rebuild"),
    ("no CUDA-capable device", "no GPU visible to trtllm-serve: check CUDA_VISIBLE_DEVICES and the container's "
                               "--gpus / nvidia.com/gpu request"),
    ("CUDA driver version is insufficient", "the host driver is older than this TensorRT-LLM's CUDA: use the "
                                            "container release that matches the driver (NVIDIA's support matrix)"),
    ("No module named", "the Python that runs trtllm-serve cannot import a package: run it in the image that "
                        "deploy/README.md names, or reinstall tensorrt_llm"),
    ("No such option", "this trtllm-serve does not take an option of the command (click's usage error): check its "
                       f"version, {_LEAST} or later (`python3 -c 'import tensorrt_llm; print(tensorrt_llm.__version__)'`)"),
    ("Extra inputs are not permitted", "the options file has a key this TensorRT-LLM's LLM API refuses "
                                       f"(TorchLlmArgs forbids unknown keys): check the version ({_LEAST} or later), or "
                                       "take the key out of serving.llm_api_options and rebuild"),
)


# What tritonserver logs on every start on a host without a GPU (pinned memory, the ensemble's CUDA
# stream, NVML): no cause of a failure there, so neither a relevant line nor a hint for CPU repositories.
NO_GPU_NOISE = ("CUDA driver version is insufficient", "Failed to initialize NVML", "no CUDA-capable device",
                "DCGM unable to start")


def diagnose(log_text: str, gpu: bool | None = None,
             failures: tuple[tuple[str, str], ...] = KNOWN_FAILURES) -> list[str]:
    """Known-failure suggestions for a server log (in table order, each once). ``gpu`` False (a repository
    that serves on the CPU) leaves out the GPU-only ones, whose messages every CPU start logs. ``failures``:
    the table (:data:`KNOWN_FAILURES` for tritonserver, :data:`TRTLLM_SERVE_FAILURES` for trtllm-serve)."""
    low = log_text.lower()
    return [f"{pat!r} in the log -> {fix}" for pat, fix in failures if pat.lower() in low
            and not (gpu is False and pat in NO_GPU_NOISE)]


def _failing_lines(log_text: str, limit: int = 25, gpu: bool | None = None) -> str:
    """The log's error-looking lines, each once (the last ``limit``); on a CPU repository without the
    no-GPU noise."""
    keys = ("error", "failed", "traceback", "exception", "unavailable", "not found", "no module")
    lines = [ln for ln in log_text.splitlines() if any(k in ln.lower() for k in keys)
             and not (gpu is False and any(n.lower() in ln.lower() for n in NO_GPU_NOISE))]
    lines = list(dict.fromkeys(lines))
    return "\n".join(lines[-limit:]) or "\n".join(log_text.splitlines()[-limit:])
