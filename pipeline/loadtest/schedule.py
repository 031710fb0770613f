"""Open-loop arrival schedules: absolute send offsets (seconds from the run's start).

Inter-arrival gaps are gamma distributed with shape ``burstiness`` and mean ``1/rate``
(``burstiness`` = 1.0 is exponential, i.e. Poisson arrivals; below 1 is burstier, above 1
is more regular), the same parametrisation as vLLM's benchmark_serving. Offsets are
cumulative, so the schedule is absolute: a late send does not push later ones back.
"""

from __future__ import annotations

import numpy as np


def arrival_offsets(rate: float, n: int, *, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """``n`` send offsets in seconds for ``rate`` requests/s; the first request goes at its gap, not at 0."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0 requests/s, got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0 (1.0 = Poisson), got {burstiness}")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps)


def parse_sweep(text: str | None, kind=float) -> list:
    """``"1,2,4"`` -> [1, 2, 4]; None -> []."""
    if text is None or str(text).strip() == "":
        return []
    return [kind(x) for x in str(text).split(",") if x.strip()]
