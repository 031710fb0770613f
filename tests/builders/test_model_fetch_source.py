"""The converted embedded model's SOURCE.json holds no checkout path: two clones can share one cache."""

from __future__ import annotations

import json
from pathlib import Path

from builders.model_fetch import EMBEDDED, source_record


def test_source_record_is_the_same_from_two_checkouts():
    em = next(iter(EMBEDDED.values()))
    a = source_record(Path("/home/alice/trtpipe/.venv/lib/python3.11/site-packages/m/model.gguf"), em)
    b = source_record(Path("/srv/ci/clone-2/.venv/lib/python3.11/site-packages/m/model.gguf"), em)
    assert a == b
    assert "/" not in json.dumps(a).replace(em.wheel, "").replace("\\/", "")
