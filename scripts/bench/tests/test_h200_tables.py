"""h200_tables.py: the served counters over the measured requests, for old and new reports."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/bench
import h200_tables  # noqa: E402


def _point(window):
    # the sixth session's served 128/128 point at 8 users (session6-b-bench-served): 8 measured + 1 warm-up request
    deltas = {"trtpipe_runtime_total{kind=tokens,model=tensorrt_llm,runtime=pytorch}": 1129.0,
              "trtpipe_runtime_total{kind=steps,model=tensorrt_llm,runtime=pytorch}": 254.0,
              "trtpipe_runtime_total{kind=responses,model=tensorrt_llm,runtime=pytorch}": 1129.0,
              "trtpipe_runtime_response_seconds_total{model=tensorrt_llm,runtime=pytorch,stage=send}": 0.3}
    return {"point": {"input_len": 128, "output_len": 128, "concurrency": 8}, "counter_deltas": deltas,
            "counter_window": window, "requests": [{"warmup": True}] + [{"warmup": False}] * 8}


def test_old_reports_lose_the_warmup_request_that_ran_alone():
    c = h200_tables.served_counts(_point(None))
    assert (c["tokens"], c["steps"], c["responses"]) == (1001.0, 126.0, 1001.0)  # 128 tokens in 128 steps off
    assert c["send"] == 0.3


def test_new_reports_are_taken_as_they_are():
    c = h200_tables.served_counts(_point("measured requests (from the end of the warm-up)"))
    assert (c["tokens"], c["steps"]) == (1129.0, 254.0)
