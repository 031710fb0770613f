"""Admission: how many requests a served build holds at once before it refuses more as overloaded.

Every runtime generates for at most ``limits.max_batch_size`` sequences a step (TensorRT-LLM's in-flight batch;
the portable runtime's ``max_requests_per_batch``) and keeps at most ``serving.max_queue_size`` more waiting for
a slot (the ``max_queue_size`` parameter of the ``tensorrt_llm`` model: TensorRT-LLM's executor rejects beyond it,
the portable runtime answers "overloaded ... serving.max_queue_size is N: retry later",
model_repo/templates/tensorrt_llm_pytorch/1/model.py; 0 = no limit, requests wait). So a load of more than
max_batch_size + max_queue_size concurrent sequences sees the excess refused at once, not queued. A request that
asks for several sequences (several prompts, ``n``) takes that many places.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict


class AdmissionPlan(BaseModel):
    """The admission capacity of a build (plan.json ``admission``).

    Attributes:
        in_flight: sequences generated in one step at most (``limits.max_batch_size``).
        queued: sequences waiting for a slot at most (``serving.max_queue_size``); None: no limit (0 in the spec).
        capacity: ``in_flight + queued`` sequences held at once; None: no limit (the excess waits).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    in_flight: int
    queued: Optional[int]
    capacity: Optional[int]

    def text(self) -> str:
        """One line for the plan and the load-test report."""
        head = f"{self.in_flight} in flight (limits.max_batch_size)"
        if self.capacity is None:
            return (f"{head}; no queue limit (serving.max_queue_size 0): more requests wait for a slot, none is "
                    "refused as overloaded")
        return (f"{head} + {self.queued} queued (serving.max_queue_size) = {self.capacity} requests at once; more "
                "concurrent requests are refused as overloaded at once (raise serving.max_queue_size, 0 = no limit)")


def admission_plan(max_batch_size: int, max_queue_size: int) -> AdmissionPlan:
    """The :class:`AdmissionPlan` of ``limits.max_batch_size`` and ``serving.max_queue_size`` (0: no queue limit)."""
    queued = max_queue_size or None
    return AdmissionPlan(in_flight=max_batch_size, queued=queued,
                         capacity=None if queued is None else max_batch_size + queued)
