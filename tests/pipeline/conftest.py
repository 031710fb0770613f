"""Shared fixtures for the pipeline tests: model config.json files kept under tests/assets/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def hf_config(name: str) -> dict:
    """The config.json of tests/assets/<name>/ as a dict."""
    return json.loads((ASSETS / name / "config.json").read_text())


@pytest.fixture
def smollm2() -> dict:
    return hf_config("smollm2-135m")


@pytest.fixture
def llama3_8b() -> dict:
    return hf_config("llama-3-8b")
