"""The engine proxy of the portable runtime's `tensorrt_llm` model (engine_process = true): the calls model.py
makes on a manager, forwarded over a socketpair to engine_worker.py, which runs the generation loop in its own
process (protocol in that file); a receiver thread turns each step message into outputs and routes them."""

import os as _os
import sys as _sys
import threading
import time

import triton_python_backend_utils as pb_utils

import engine_worker as engine
import sampling

_WORKER_PY = engine.__file__


class _Output:
    """One sequence's state after a step, shaped like transformers' GenerationOutput for _deliver."""

    __slots__ = ("request_id", "generated_tokens", "finished", "error")

    def __init__(self, request_id, generated_tokens, finished, error):
        self.request_id, self.generated_tokens, self.finished, self.error = request_id, generated_tokens, finished, error

    def is_finished(self):
        return self.finished


def _worker_python():
    """A python of the stub's own version for engine_worker.py (the worker gets the stub's sys.path, which
    holds that version's standard library): the stub's interpreter when it is a python executable, the
    one under its prefix, else pythonX.Y or python3 on PATH (version checked)."""
    import shutil
    import subprocess

    version = f"{_sys.version_info[0]}.{_sys.version_info[1]}"
    candidates = [_sys.executable if _os.path.basename(_sys.executable or "").startswith("python") else None]
    candidates += [_os.path.join(prefix, "bin", f"python{version}") for prefix in (_sys.prefix, _sys.base_prefix)]
    candidates += [shutil.which(f"python{version}"), shutil.which("python3")]
    for path in candidates:
        if path and _os.path.isfile(path) and _os.access(path, _os.X_OK):
            out = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60)
            if out.stdout.strip() == version:
                return path
    return None


class _EngineProcess:
    """The manager of engine_process = true: takes the calls model.py makes on a manager and forwards them
    over a socketpair to engine_worker.py, which runs the generation loop in its own process (protocol in
    that file). A receiver thread turns each step message into outputs and routes them; it is this
    mode's dispatcher and the only per-step work in the stub's interpreter."""

    def __init__(self, owner, engine_dir, settings, device, dtype, python):
        import socket
        import subprocess
        from multiprocessing.connection import Connection

        self.owner, self.tokens, self.kv_blocks, self._kv_free, self.stopping = owner, {}, {}, None, False
        self.dead = None  # why the worker is gone, once it died
        self.send_lock = threading.Lock()
        python = python or _worker_python()
        if not python:
            raise pb_utils.TritonModelException(
                f"engine_process = true needs a python{_sys.version_info[0]}.{_sys.version_info[1]} for the worker "
                "(the stub's version): set the engine_python parameter or put it on PATH")
        ours, theirs = socket.socketpair()
        env = dict(_os.environ, PYTHONPATH=_os.pathsep.join(p for p in _sys.path if p))
        self.proc = subprocess.Popen([python, _WORKER_PY, str(theirs.fileno()), str(_os.getpid())],
                                     pass_fds=(theirs.fileno(),), env=env)  # it ends when this stub does
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(("init", engine_dir, settings, device, dtype))
        deadline = time.monotonic() + 3600
        while not self.conn.poll(1.0):  # model load: up to minutes for a large model
            if time.monotonic() > deadline:
                self.stop(timeout=1)
                raise pb_utils.TritonModelException("the engine worker was not ready after an hour")
            if self.proc.poll() is not None:
                raise pb_utils.TritonModelException(
                    f"the engine worker ({python} {_WORKER_PY}) exited with {self.proc.returncode} before it was "
                    "ready: see its messages above in the server log")
        kind, payload = self.conn.recv()
        if kind != "ready":
            self.stop()
            raise pb_utils.TritonModelException(f"the engine worker failed to start: {payload}")
        self.info = payload
        self.receiver = threading.Thread(target=self._receive, name="trtpipe-engine-receiver", daemon=True)

    def _send(self, message):
        with self.send_lock:
            self.conn.send(message)

    def start(self):
        self.receiver.start()

    def add_request(self, ids, request_id, max_new_tokens, streaming, eos_token_id, **kw):
        import dataclasses

        entry = self.owner.table.get(kw[sampling.HANDLE_KWARG])
        params = dict(dataclasses.asdict(entry.params), seed_drawn=entry.seed)
        state = self.owner.requests.get(request_id)
        self._send(("add", request_id, list(ids), max_new_tokens, eos_token_id, params,
                    bool(state is not None and state.perf)))
        return request_id

    def cancel_request(self, request_id):
        try:
            self._send(("cancel", request_id))
        except OSError:
            pass  # the worker is gone; _receive fails what was live

    def kv_free(self):
        """The free-block count the worker last reported; asks for a fresh one."""
        try:
            self._send(("kv",))
        except OSError:
            pass
        return self._kv_free

    def _receive(self):
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "kv":
                self._kv_free = message[1]
                continue
            outputs, done = [], []
            for rid, new, finished, error, lps, blocks, logits, extra in message[1]:
                state = self.owner.requests.get(rid)
                if state is None:  # cancelled or failed meanwhile
                    self.tokens.pop(rid, None)
                    self.kv_blocks.pop(rid, None)
                    continue
                tokens = self.tokens.setdefault(rid, [])
                tokens.extend(new)
                entry = self.owner.table.get(state.handle) if (lps or logits or extra) else None
                if entry is not None:
                    entry.log_probs.extend(lps or ())
                    entry.logits.extend(logits or ())
                    if extra:
                        entry.top.extend(extra.get("top") or ())
                        if extra.get("prompt") is not None:
                            entry.prompt = extra["prompt"]
                if blocks is not None:
                    self.kv_blocks[rid] = max(self.kv_blocks.get(rid, 0), blocks)
                outputs.append(_Output(rid, tokens, finished, error))
                if finished:
                    done.append(rid)
            self.owner._route_batch(outputs)
            for rid in done:
                self.tokens.pop(rid, None)
                self.kv_blocks.pop(rid, None)
        if not self.stopping:  # the worker died: every live request, and every later one, ends with the reason
            try:
                code = self.proc.wait(timeout=5)
            except Exception:
                code = self.proc.poll()
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            self.dead = (f"the engine worker process (pid {self.proc.pid}) died ({how}): this model cannot generate "
                         "until the server restarts (`trtpipe stop`, then `trtpipe serve`)")
            pb_utils.Logger.log_error(f"tensorrt_llm: {self.dead}")
            self.owner._route_batch([_Output(rid, [], True, self.dead) for rid in list(self.owner.requests)])

    def stop(self, block=True, timeout=10):
        self.stopping = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


