"""`make test` runs on pytest-xdist workers; tests/conftest.py's ``MODULE_GROUPS`` keeps the modules that share an
expensive session fixture on one worker. A module that starts using such a fixture without joining its group
would silently make the fixture twice (a second LoRA build, repeated lm-eval runs)."""

import re

from tests.conftest import MODULE_GROUPS, REPO

SHARED_FIXTURES = {"lm_eval_once": "lm-eval", "lora_build": "lora", "lora_server": "lora"}


def test_every_module_using_a_shared_session_fixture_is_in_its_group():
    users = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.name == "test_suite_groups.py":
            continue
        text = path.read_text(encoding="utf-8")
        for fixture, group in SHARED_FIXTURES.items():
            if re.search(rf"\b{fixture}\b", text):
                users[path.relative_to(REPO).as_posix()] = group
    assert users, "no module uses a shared fixture: SHARED_FIXTURES is out of date"
    assert {m: MODULE_GROUPS.get(m) for m in users} == users
    assert set(MODULE_GROUPS) <= set(users), "MODULE_GROUPS names a module that no longer uses a shared fixture"
