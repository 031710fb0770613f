"""``trtpipe loadtest``: a load tester for the ensemble on tritonclient's gRPC asyncio API.

Modules: ``config`` (what to run), ``schedule`` (arrival times), ``workload`` (prompts and
lengths), ``runner`` (the asyncio streams, one or several client processes), ``metrics``
(per-request timings to summaries, genai-perf's definitions),
``server_metrics`` (Triton's /metrics), ``report`` (JSON, CSV, compare, SLO verdict),
``plots`` (matplotlib Agg), ``selfcheck`` (the client's own ceiling on a trivial model).
"""
