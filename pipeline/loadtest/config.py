"""What one ``trtpipe loadtest run`` does: one typed class, every field with a default and a rule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from builders.spec import default_port
from pipeline.loadtest.metrics import SLO
from pipeline.loadtest.workload import parse_length

MODES = ("closed", "open")
ENDPOINTS = ("triton", "openai-chat", "openai-completions")
FIXED_OUTPUT = ("none", "min_tokens", "ignore_eos")


@dataclass
class LoadTestConfig:
    url: str = f"127.0.0.1:{default_port('grpc_port')}"
    """The server: gRPC host:port (endpoint triton), or the OpenAI API's base URL (http://host:port/v1)."""
    endpoint: str = "triton"
    """triton (the ensemble over gRPC), openai-chat (/v1/chat/completions) or openai-completions
    (/v1/completions), streamed; OpenAI token counts come from the stream's ``usage``."""
    metrics_url: str | None = None
    """Triton's Prometheus endpoint (http://host:port/metrics); None = not scraped."""
    model: str = "ensemble"
    """Triton model the requests go to (the ensemble's tensors)."""
    mode: str = "closed"
    """closed (fixed concurrency) or open (request rate on an absolute schedule)."""
    concurrency: list[int] = field(default_factory=lambda: [1])
    """closed loop: requests in flight; several values = a sweep."""
    rate: list[float] = field(default_factory=lambda: [1.0])
    """open loop: requests/s; several values = a sweep."""
    burstiness: float = 1.0
    """open loop: gamma shape of inter-arrival gaps (1.0 = Poisson, < 1 burstier)."""
    num_requests: int = 32
    """measured requests per sweep point (warm-up not included)."""
    duration_s: float = 300.0
    """most seconds of sending per sweep point; whichever of this and num_requests comes first ends it."""
    warmup: int = 2
    """requests sent before each point's clock starts, excluded from statistics."""
    input_len: str = "128"
    """synthetic input tokens: N, uniform:LO:HI or normal:MEAN:STD."""
    output_len: str = "32"
    """max_tokens per request: N, uniform:LO:HI or normal:MEAN:STD."""
    dataset: Path | None = None
    """JSONL of real prompts instead of synthetic ones."""
    shared_prefixes: int = 0
    """synthetic: N distinct shared prefixes (system prompts), request i taking prefix i mod N (0: none)."""
    shared_prefix_len: int = 800
    """tokens of each shared prefix (800: with the default 128-token input it fits a 1,024-token max_input_len)."""
    tokenizer_dir: Path | None = None
    """served tokenizer (default: the engine folder beside the repository)."""
    fixed_output: str = "none"
    """none | min_tokens (send min_tokens = max_tokens) | ignore_eos (end_id = an id never generated)."""
    perf_metrics: bool = True
    """ask for server-side timings (return_perf_metrics) when the model has that input."""
    seed: int = 0
    """seed of prompts, lengths and arrival times."""
    connections: int = 1
    """gRPC streams per client process (requests multiplexed by request_id on each)."""
    client_procs: int = 1
    """client processes (when one cannot keep up)."""
    request_timeout_s: float = 300.0
    """a request with no final response after this long is a timeout error."""
    drain_timeout_s: float = 60.0
    """after the last send, how long in-flight requests may finish before being cut."""
    slo: SLO = field(default_factory=SLO)
    """per-request SLOs (TTFT, TPOT, E2E in seconds) for goodput and the verdict."""
    slo_attainment: float = 0.9
    """the verdict passes when at least this fraction of requests meets every SLO."""
    max_schedule_lag_s: float = 0.05
    """open loop: p95 schedule lag above this marks the run invalid (the client fell behind)."""
    max_client_cpu: float = 0.9
    """a client process busier than this fraction of one core marks the run invalid."""
    ceiling_rps: float | None = None
    """requests/s the client sustained in its self-check; points above it are marked invalid."""
    response_format: str | None = None
    """constrain every answer: ``json_object`` or ``json_schema:FILE`` (OpenAI's response_format; on the Triton
    endpoint the ensemble's guided-decoding inputs); each answer is checked (pipeline.structured) and the report
    counts the valid ones. None: no constraint."""
    tools: Path | None = None
    """openai-chat: an OpenAI tools JSON list sent with every request; the tool calls of each answer are
    checked against it."""
    tool_choice: str | None = None
    """with ``tools``: ``required``, ``auto`` (OpenAI's default, used when None) or a function's name."""
    models: list[str] = field(default_factory=list)
    """Spread the requests round-robin over these models (``--models``: the base model by its build name, LoRA
    adapters by theirs), and report each one's figures beside the totals; empty: every request to ``model``. OpenAI
    endpoints send each as ``model``; triton sends each adapter's ``lora_task_id`` (:attr:`lora_task_ids`)."""
    lora_task_ids: dict = field(default_factory=dict)
    """triton: model name -> the ``lora_task_id`` it sends (0: the base model, sent without one), from the build's
    plan.json (pipeline.loadtest.cli); every name of :attr:`models` must be here."""
    check_only: bool = False
    """check answers against ``response_format`` without sending it: the unconstrained baseline of a constrained
    run (same prompts, same client work), to compare with ``trtpipe loadtest compare``."""

    def constraint(self):
        """The pipeline.structured.Constraint this run sends or checks (None for none); raises ConstraintError."""
        from pipeline.structured import response_format, tools_file

        if self.tools is not None:
            return tools_file(self.tools, self.tool_choice)
        if self.response_format is not None:
            return response_format(self.response_format)
        return None

    def problems(self) -> list[str]:
        """Every broken rule at once."""
        p = []
        if self.mode not in MODES:
            p.append(f"mode = {self.mode!r}: must be one of {MODES}")
        if self.mode == "closed" and (not self.concurrency or any(c < 1 for c in self.concurrency)):
            p.append(f"concurrency = {self.concurrency}: each value must be an integer >= 1")
        if self.mode == "open" and (not self.rate or any(not (r > 0 and math.isfinite(r)) for r in self.rate)):
            p.append(f"rate = {self.rate}: each request rate must be > 0 requests/s")
        if not self.burstiness > 0:
            p.append(f"burstiness = {self.burstiness}: must be > 0 (1.0 = Poisson)")
        for name in ("num_requests", "connections", "client_procs"):
            if getattr(self, name) < 1:
                p.append(f"{name} = {getattr(self, name)}: must be >= 1")
        if self.warmup < 0:
            p.append(f"warmup = {self.warmup}: must be >= 0")
        for name in ("duration_s", "request_timeout_s", "drain_timeout_s", "max_schedule_lag_s"):
            if not getattr(self, name) > 0:
                p.append(f"{name} = {getattr(self, name)}: must be > 0")
        for name in ("input_len", "output_len"):
            try:
                parse_length(getattr(self, name))
            except ValueError as exc:
                p.append(f"{name}: {exc}")
        if self.fixed_output not in FIXED_OUTPUT:
            p.append(f"fixed_output = {self.fixed_output!r}: must be one of {FIXED_OUTPUT}")
        if not 0 < self.slo_attainment <= 1:
            p.append(f"slo_attainment = {self.slo_attainment}: must be in (0, 1]")
        for name in ("ttft", "tpot", "e2e"):
            v = getattr(self.slo, name)
            if v is not None and not v > 0:
                p.append(f"slo {name} = {v}: must be > 0 seconds")
        if self.endpoint not in ENDPOINTS:
            p.append(f"endpoint = {self.endpoint!r}: must be one of {ENDPOINTS}")
        elif self.endpoint != "triton" and not self.url.startswith(("http://", "https://")):
            p.append(f"url = {self.url!r}: endpoint {self.endpoint} takes the OpenAI API's base URL, e.g. "
                     f"http://127.0.0.1:{default_port('openai_port')}/v1")
        if self.endpoint != "triton" and self.fixed_output == "min_tokens":
            p.append("fixed_output = min_tokens: use --ignore-eos with the OpenAI endpoints (the ignore_eos "
                     "extension vLLM's benchmark sends)")
        if self.shared_prefixes < 0 or (self.shared_prefixes and self.shared_prefix_len < 1):
            p.append(f"shared_prefixes = {self.shared_prefixes}, shared_prefix_len = {self.shared_prefix_len}: "
                     "need N >= 0 prefixes of >= 1 token")
        if self.shared_prefixes and self.dataset is not None:
            p.append("shared_prefixes with a dataset: the shared-prefix workload is synthetic; drop one")
        if len(set(self.models)) != len(self.models):
            p.append(f"models = {self.models}: a model named twice")
        if self.endpoint == "triton" and self.models:
            unknown = [m for m in self.models if m not in self.lora_task_ids]
            if unknown:
                p.append(f"models: {', '.join(map(repr, unknown))} neither the build's base model nor one of its LoRA "
                         f"adapters (served: {', '.join(map(repr, self.lora_task_ids)) or 'none known'}): name the "
                         "base by its build name, adapters as the build file's lora.adapters")
        if self.dataset is not None and not Path(self.dataset).is_file():
            p.append(f"dataset = {self.dataset}: file not found")
        return p + constraint_problems(self.endpoint, self.response_format, self.tools, self.tool_choice,
                                       self.fixed_output, self.check_only)

    def points(self) -> list[dict]:
        """The sweep: one load shape per point."""
        if self.mode == "closed":
            return [{"mode": "closed", "concurrency": int(c)} for c in self.concurrency]
        return [{"mode": "open", "rate": float(r), "burstiness": self.burstiness} for r in self.rate]

    def as_dict(self) -> dict:
        d = asdict(self)
        for k in ("dataset", "tokenizer_dir", "tools"):
            d[k] = str(d[k]) if d[k] is not None else None
        return d


def constraint_problems(endpoint: str, response_format: str | None, tools, tool_choice: str | None,
                        fixed_output: str = "none", check_only: bool = False) -> list[str]:
    """What is wrong with a run's structured-output arguments, every problem at once (the files read and checked
    as the server would check them: pipeline.structured). Called before any server is started."""
    from pipeline.structured import ConstraintError, response_format as read_format, tools_file

    p = []
    if tool_choice is not None and tools is None:
        p.append(f"tool_choice = {tool_choice!r} needs tools: give --tools FILE (an OpenAI tools JSON list)")
    if tools is not None and endpoint != "openai-chat":
        p.append(f"tools with endpoint {endpoint}: tool calling is a chat feature of the OpenAI API: use "
                 "--endpoint openai-chat")
    if tools is not None and response_format is not None:
        p.append("response_format with tools: one constraint per run, whose answers the report counts (a forced "
                 "tool call is constrained by the tools' own schema): drop one")
    if check_only and response_format is None:
        p.append("check_only needs response_format: give --response-format json_object or json_schema:FILE (what "
                 "the answers are checked against)")
    if check_only and tools is not None:
        p.append("check_only with tools: an answer to a request without tools holds no tool calls to check; "
                 "drop --check-only")
    if (response_format is not None or tools is not None) and fixed_output != "none" and not check_only:
        p.append(f"fixed_output = {fixed_output}: a constrained answer ends where its grammar is complete, so "
                 "output lengths cannot be fixed (--ignore-eos / --fixed-output min_tokens would run the answer "
                 "past its end); drop that flag, and fix max_tokens with --output-len")
    for what, read in (("response_format", lambda: read_format(response_format)),
                       ("tools", lambda: tools_file(tools, tool_choice))):
        if (what == "tools" and tools is None) or (what == "response_format" and response_format is None):
            continue
        try:
            read()
        except ConstraintError as exc:
            p.append(str(exc))
    return p
