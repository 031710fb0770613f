# The generation loop of the `tensorrt_llm` model (pytorch runtime), and with engine_process = true
# the process that runs it outside the Python-backend stub.
#
# build_manager() makes transformers' ContinuousBatchingManager with the runtime's settings and
# sampling processors; model.py calls it in the stub (engine_process false) or starts this file as
# its own process (engine_process true, the default), so that the generation loop does not share the
# stub's interpreter and GIL with returning tokens through the Python backend (the design of
# TensorRT-LLM's executor proxy and vLLM's engine-core process).
#
# Protocol over one socketpair (multiprocessing.connection, pickled tuples of plain values):
#   stub -> worker  ("init", engine_dir, settings, device, dtype)   once, first
#                   ("add", rid, ids, max_new_tokens, end_ids, params, perf)
#                   ("cancel", rid)   ("kv",)   ("stop",)
#   worker -> stub  ("ready", info)   or   ("fatal", message)
#                   ("step", [(rid, new_tokens, finished, error, log_probs, kv_blocks, logits, extra), ...])
#                   one per step (log_probs / logits: lists for the new tokens when the request asked for them, else
#                   None; extra: None, or {"top": [(log probs, ids)] per new token (num_top_logprobs), "prompt":
#                   (log probs, top log probs, top ids) of the prompt, in the sequence's first item only})
#                   ("kv", free_blocks or None)
# The worker exits when the stub's end of the socket closes (the stub died or stopped), and within about half a
# second of its stub's death even while that socket stays open (trtpipe_runtime.lifeline.watch_parent: argv[2] is
# the stub's pid).

import json as _json
import os as _os
import sys as _sys

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import threading
import traceback

from trtpipe_runtime.decoding import DecodingError
from trtpipe_runtime.runtime_config import apply_sdpa_backends, continuous_batching_config


def load_sampling():
    """sampling.py beside this file (imported on first use: it imports torch and transformers)."""
    import sampling

    return sampling


def build_manager(engine_dir, settings, device, dtype_name):
    """The model on ``device`` in ``dtype_name`` and its continuous-batching manager (not started).

    Returns (manager, table, info): the sampling RequestTable the processors read (its ``grammars``: the
    guided-decoding engine, trtpipe_runtime.grammar.Grammars; its ``prompts``: the prompt scorer, log_probs.Memo,
    whose lock the manager's steps take; its ``lora``: the LoRA adapters, adapters.Lora, or None), and
    {"default_end_ids", "pad_id", "vocab_size"} from the engine folder, "sdpa_backends" (the
    attention kernels torch may pick in this process, after settings["sdpa_backends"]) and "lora" (lora_task_id ->
    adapter name, from the engine's lora/adapters.json).

    Raises RuntimeError for device cuda where torch in this process sees no GPU.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if device == "cuda" and not torch.cuda.is_available():  # checked where the model is loaded
        raise RuntimeError("device=cuda but torch sees no GPU in the process that runs the generation loop: "
                           "check CUDA_VISIBLE_DEVICES and that this torch is a CUDA build")

    sampling = load_sampling()
    import adapters  # beside this file: the build's LoRA adapters (none: an empty table)

    lora_table = adapters.read_table(engine_dir)
    if lora_table:  # rows of one batch differ per adapter: no CUDA graph of one batch, no KV shared across adapters
        settings = {**settings, "use_cuda_graph": False, "allow_block_sharing": False}
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    sdpa = apply_sdpa_backends(settings)
    with open(_os.path.join(engine_dir, "engine.json")) as fh:  # the family's attention (sdpa unless it has none)
        attn = _json.load(fh).get("attn_implementation", "sdpa")
    model = AutoModelForCausalLM.from_pretrained(engine_dir, dtype=dtype, attn_implementation=attn,
                                                 trust_remote_code=settings.get("trust_remote_code", False))
    model.to(device).eval()
    with open(_os.path.join(engine_dir, "generation_config.json")) as fh:
        gen = _json.load(fh)
    eos = gen.get("eos_token_id")
    end_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    pad_id = gen.get("pad_token_id", end_ids[0] if end_ids else 0)
    # Greedy at creation: the library's step ends in one argmax; sampled requests are drawn by
    # sampling.SamplerProcessor (see sampling.py for why not the library's per-request warpers).
    gcfg = GenerationConfig(max_new_tokens=settings["max_seq_len"], eos_token_id=end_ids or None,
                            pad_token_id=pad_id, **sampling.CREATION_DEFAULTS)
    manager = model.init_continuous_batching(generation_config=gcfg,
                                             continuous_batching_config=continuous_batching_config(settings))
    table = sampling.RequestTable()
    from trtpipe_runtime.grammar import Grammars

    # Guided decoding: xgrammar over the engine folder's tokenizer, made on the first guided request.
    table.grammars = Grammars(engine_dir, int(model.config.vocab_size), end_ids)
    sampling.install(manager, table, table.grammars)
    import log_probs  # beside this file, as sampling.py

    table.prompts = log_probs.Memo(manager)  # before the loop starts: every step takes its lock

    def task_of(state):
        entry = table.get(int(state.logit_processor_kwargs.get(sampling.HANDLE_KWARG, -1)))
        return entry.params.lora_task_id if entry is not None else 0

    table.lora = adapters.install(manager, engine_dir, lora_table, task_of)
    table.prompts.scope = table.lora.only if table.lora is not None else None
    return manager, table, {"default_end_ids": end_ids, "pad_id": pad_id,
                            "vocab_size": int(model.config.vocab_size), "sdpa_backends": sdpa,
                            "lora": {e["task_id"]: e["name"] for e in lora_table}}


def loop_failure(manager):
    """Why the manager's generation loop can no longer generate (its fatal error, or that its thread has ended),
    else None. transformers' manager keeps dropping requests once the loop died (``add_request`` returns None and
    logs "The background thread died with a fatal error"): this names the cause instead
    (transformers/generation/continuous_batching/continuous_api.py, BackgroundThreadStatus.fatal_error)."""
    status = getattr(manager, "background_thread_status", None)
    error = getattr(status, "fatal_error", None)
    if error is not None:
        return f"the generation loop died: {type(error).__name__}: {error}"
    thread = getattr(manager, "_generation_thread", None)
    if thread is not None and not thread.is_alive() and not getattr(status, "local_status", 0):
        return "the generation loop's thread has ended"
    return None


def await_loop(manager, timeout_s=600.0):
    """Wait until the started manager's loop has made its batch processor (the paged KV cache allocated), so a
    loop that dies at its start (e.g. ``MemoryError``: the KV pool does not fit the device) fails the model's
    load instead of leaving a READY model that drops every request. Returns after ``timeout_s`` (seconds) if the
    loop is still starting.

    Raises:
        RuntimeError: the loop died; the message carries its error and the fix for the common cause.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        why = loop_failure(manager)
        if why is not None:
            raise RuntimeError(f"{why}. If the KV cache does not fit this device, build for its target "
                               "(`--target`) or lower serving.kv_cache_free_gpu_mem_fraction")
        if getattr(manager, "batch_processor", None) is not None or not hasattr(manager, "batch_processor"):
            return
        time.sleep(0.02)


def compile_guide(table, params):
    """Compile a guided request's grammar before it joins a batch (cached per guide), so a grammar xgrammar
    cannot compile fails that request here, not the generation loop. ``params``: SamplingParams or its dict.

    Raises:
        trtpipe_runtime.decoding.DecodingError: the grammar does not compile.
    """
    get = params.get if isinstance(params, dict) else lambda k: getattr(params, k)
    if get("guide_type"):
        from trtpipe_runtime.grammar import Guide

        table.grammars.compiled(Guide(get("guide_type"), get("guide")))


def free_blocks(manager, num_blocks):
    """Free blocks of the manager's paged KV cache (None before the first batch, or on transformers
    without compute_free_capacity, 5.17)."""
    cache = getattr(getattr(manager, "batch_processor", None), "cache", None)
    free_capacity = getattr(cache, "compute_free_capacity", None)
    return None if free_capacity is None else int(round(free_capacity(relative=True) * num_blocks))


def blocks_of(manager, rid):
    """KV blocks the manager's cache holds for one sequence now (0 when unknown or freed)."""
    cache = getattr(getattr(manager, "batch_processor", None), "cache", None)
    allocators = getattr(cache, "cache_allocators", None)  # transformers >= 5.24
    if not isinstance(allocators, dict):
        return 0
    return max([len(getattr(a, "block_table", {}).get(rid, ())) for a in allocators.values()] or [0])


class Worker:
    """The worker process's side: requests in, one message per generation step out."""

    def __init__(self, conn):
        self.conn = conn
        self.send_lock = threading.Lock()
        self.live = {}  # rid -> [handle, tokens sent, perf]

    def send(self, message):
        with self.send_lock:
            self.conn.send(message)

    def run(self):
        kind, engine_dir, settings, device, dtype = self.conn.recv()
        assert kind == "init", kind
        try:
            self.manager, self.table, info = build_manager(engine_dir, settings, device, dtype)
            self.sampling = load_sampling()
            self.num_blocks = settings["num_blocks"]
            self.manager.output_router.deliver_batch = self.on_step
            self.manager.output_router.deliver = lambda output: self.on_step([output])
            self.manager.start()
            await_loop(self.manager)
        except Exception as exc:  # the stub reports it as the model's load error
            self.send(("fatal", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
            return
        self.send(("ready", info))
        try:
            self.receive()
        finally:
            try:
                self.manager.stop(block=True, timeout=10)
            except Exception:
                pass

    def receive(self):
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return  # the stub is gone
            kind = message[0]
            if kind == "add":
                _, rid, ids, max_new, end_ids, params, perf = message
                seed = params.pop("seed_drawn")
                handle = self.table.add(self.sampling.SamplingParams(**{**params, "seed": seed}))
                self.live[rid] = [handle, 0, perf]
                try:
                    compile_guide(self.table, params)
                except DecodingError as exc:  # that request's error; the loop never sees its grammar
                    self.forget(rid)
                    self.send(("step", [(rid, [], True, str(exc), None, None, None, None)]))
                    continue
                try:
                    if params.get("return_prompt_log_probs"):  # one forward pass, before the request generates
                        self.table.get(handle).prompt = self.score_prompt(ids, params.get("num_top_logprobs", 0),
                                                                          params.get("lora_task_id", 0))
                except Exception as exc:
                    self.forget(rid)
                    self.send(("step", [(rid, [], True, f"return_prompt_log_probs: scoring the prompt failed: "
                                         f"{type(exc).__name__}: {exc}", None, None, None, None)]))
                    continue
                try:
                    added = self.manager.add_request(ids, request_id=rid, max_new_tokens=max_new, streaming=True,
                                                     eos_token_id=end_ids, **{self.sampling.HANDLE_KWARG: handle})
                except Exception as exc:
                    added, why = None, f"{type(exc).__name__}: {exc}"
                else:
                    why = loop_failure(self.manager) or "stopping or queue full"
                if added is None:
                    self.forget(rid)
                    self.send(("step", [(rid, [], True, f"the runtime is not accepting requests ({why})",
                                         None, None, None, None)]))
            elif kind == "cancel":
                self.manager.cancel_request(message[1])
                self.forget(message[1])
            elif kind == "kv":
                self.send(("kv", free_blocks(self.manager, self.num_blocks)))
            elif kind == "stop":
                return

    def score_prompt(self, ids, k, task_id=0):
        """The prompt's log probabilities (log_probs.py beside this file) as plain lists, under adapter ``task_id``."""
        return self.table.prompts.get(ids, k, task_id).as_tuple()

    def forget(self, rid):
        entry = self.live.pop(rid, None)
        if entry is not None:
            self.table.drop(entry[0])

    def on_step(self, outputs):
        """The library's per-step delivery (generation thread): one message with each sequence's new tokens."""
        items = []
        for out in outputs:
            entry = self.live.get(out.request_id)
            if entry is None:
                continue  # cancelled meanwhile
            handle, sent, perf = entry
            generated = out.generated_tokens  # cumulative: only what is new since the last step is sent
            n = len(generated)
            finished = bool(out.is_finished()) or bool(out.error)
            lps = logits = None
            record = self.table.get(handle)
            if record is not None and record.params.return_log_probs:
                lps = record.log_probs[sent:n]
            if record is not None and record.params.return_generation_logits:
                logits = record.logits[sent:n]
            extra = None
            if record is not None and (record.params.num_top_logprobs or record.prompt is not None):
                extra = {"top": record.top[sent:n]}
                if record.prompt is not None:  # once, with the sequence's first step
                    extra["prompt"], record.prompt = record.prompt, None
            items.append((out.request_id, list(generated[sent:n]), finished, str(out.error) if out.error else None,
                          lps, blocks_of(self.manager, out.request_id) if perf else None, logits, extra))
            entry[1] = n
            if finished:
                self.forget(out.request_id)
        if items:
            try:
                self.send(("step", items))
            except (OSError, ValueError):
                _os._exit(0)  # the stub is gone: nothing to deliver to


def main(fd, parent=None):
    """Serve the stub on socket ``fd``; ``parent``: the stub's pid (this process ends once it has exited)."""
    from multiprocessing.connection import Connection

    from trtpipe_runtime.lifeline import end_stub_with_server, watch_parent

    watch_parent("the engine worker", parent=parent)
    # a stub wedged after tritonserver's death cannot run its own watch: this process ends it (and itself)
    end_stub_with_server(parent if parent is not None else _os.getppid(), "the engine worker's stub")
    Worker(Connection(fd)).run()


if __name__ == "__main__":
    main(int(_sys.argv[1]), int(_sys.argv[2]) if len(_sys.argv) > 2 else None)
