"""Integration-test fixtures: each module that started a local Ray cluster shuts it down at its end."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield
    ray = sys.modules.get("ray")  # only modules that imported Ray can have started it
    if ray is not None and ray.is_initialized():
        ray.shutdown()
