"""Real local servers for the load tester's failure paths (no model, no tritonserver).

``OpenAIStub``: a raw-socket OpenAI-style streaming server, which can misbehave after some completions the way a
dying server does. ``triton_stub``: a gRPC server speaking Triton's protocol (the ``GRPCInferenceServiceServicer``
of tritonclient) that kills itself with SIGKILL on a given request, as ``kill -9`` of tritonserver. Each runs in
its own process (``python -m tests.loadtest.fake_servers PORT openai|triton ...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]


class OpenAIStub:
    """``GET /v1/models`` lists ``stub``; ``POST /v1/completions`` streams one text event per requested token, a
    ``usage`` event (completion_tokens only) and ``data: [DONE]``, each response closing its connection.

    After ``good`` completions, every later one does ``then``: ``"close"`` (read the request, close without an
    answer), ``"cut"`` (the headers and one event, then close: no ``[DONE]``) or ``"refuse"`` (stop listening, so
    later connections are refused). ``service_s``: seconds each completion takes, one at a time (a server with
    ``1 / service_s`` requests/s of capacity). ``admit``: completions held at once (in service or waiting for it)
    before more are refused at once with 503 ``overloaded``, as the portable runtime words its max_queue_size
    refusal (0: no limit). Runs in a subprocess (its CPU time is not the client's); the
    context manager yields nothing, ``url`` is its base URL.
    """

    def __init__(self, good: int = 10**9, then: str = "close", service_s: float = 0.0, admit: int = 0):
        self.good, self.then, self.service_s, self.admit = good, then, service_s, admit
        self.held = 0
        self.completions = 0
        self.port = _free_port()
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "OpenAIStub":
        self.proc = _start([str(self.port), "openai", str(self.good), self.then, str(self.service_s),
                            str(self.admit)], self.port)
        return self

    def __exit__(self, *exc) -> None:
        _stop(self.proc)

    async def serve(self) -> None:
        self.lock = asyncio.Lock()
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        await asyncio.Event().wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
            except (asyncio.IncompleteReadError, ConnectionError):  # a probe that connected and left
                return
            method, path = head.split(" ")[:2]
            headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
            body = await reader.readexactly(int({k.lower(): v for k, v in headers.items()}.get("content-length", 0)))
            if method == "GET" and path.endswith("/models"):
                data = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
                return
            n, self.completions = self.completions, self.completions + 1
            failing = n >= self.good
            if failing and self.then in ("close", "refuse"):
                if self.then == "refuse" and self.server.is_serving():
                    self.server.close()
                return
            tokens = int(json.loads(body).get("max_tokens", 1))
            if self.admit and self.held >= self.admit:
                data = json.dumps({"error": {"message": f"overloaded: {self.held - 1} requests wait for a batch slot "
                                             f"and serving.max_queue_size is {self.admit - 1}: retry later",
                                             "type": "server_error", "code": "overloaded"}}).encode()
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
                return
            self.held += 1
            try:
                async with self.lock:
                    await asyncio.sleep(self.service_s)
            finally:
                self.held -= 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            for k in range(tokens):
                writer.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": f"t{k} "}]}).encode() + b"\n\n")
                if failing:  # "cut": one event, then the connection goes
                    return
            usage = {"choices": [], "usage": {"completion_tokens": tokens}}
            writer.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        finally:
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(argv: list[str], port: int) -> subprocess.Popen:
    """``python -m tests.loadtest.fake_servers *argv``, once it accepts connections on ``port``."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.loadtest.fake_servers", *argv], cwd=ROOT)
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"the stub server {argv} did not start (exit status {proc.poll()})")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@contextlib.contextmanager
def triton_stub(die_at: int) -> Iterator[str]:
    """A Triton-protocol gRPC server with model ``ensemble`` (inputs text_input, max_tokens; output
    num_output_tokens) that answers each streamed request with one final response carrying one token, and
    SIGKILLs itself on streamed request number ``die_at`` (0-based); yields its host:port."""
    port = _free_port()
    proc = _start([str(port), "triton", str(die_at)], port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)


def _serve_triton(port: int, die_at: int) -> None:
    from concurrent import futures

    import grpc
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    seen = [0]

    class Servicer(pbg.GRPCInferenceServiceServicer):
        def ServerLive(self, request, context):
            return pb.ServerLiveResponse(live=True)

        def RepositoryIndex(self, request, context):
            return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(name="ensemble",
                                                                                            state="READY")])

        def ModelReady(self, request, context):
            return pb.ModelReadyResponse(ready=True)

        def ModelMetadata(self, request, context):
            t = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(name="ensemble", versions=["1"], platform="ensemble",
                                            inputs=[t(name="text_input", datatype="BYTES", shape=[-1]),
                                                    t(name="max_tokens", datatype="INT32", shape=[-1])],
                                            outputs=[t(name="num_output_tokens", datatype="INT32", shape=[-1])])

        def ModelStreamInfer(self, request_iterator, context):
            for req in request_iterator:
                if seen[0] == die_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                seen[0] += 1
                out = pb.ModelInferResponse.InferOutputTensor(name="num_output_tokens", datatype="INT32", shape=[1])
                ir = pb.ModelInferResponse(model_name="ensemble", id=req.id, outputs=[out],
                                           raw_output_contents=[np.array([1], "<i4").tobytes()])
                ir.parameters["triton_final_response"].bool_param = True
                yield pb.ModelStreamInferResponse(infer_response=ir)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    if sys.argv[2] == "triton":
        _serve_triton(int(sys.argv[1]), int(sys.argv[3]))
    else:
        stub = OpenAIStub(int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), int(sys.argv[6]))
        stub.port = int(sys.argv[1])
        asyncio.run(stub.serve())
