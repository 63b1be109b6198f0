"""Shared fixtures: small trainer configs on a tiny random-init model that run in seconds on a CPU."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.helpers.configs import tiny_config

# one torch thread per pytest-xdist worker (`make test` runs two on two cores): more would oversubscribe the cores
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")


@pytest.fixture
def make_config(tmp_path):
    def make(**sections: Any):
        from trainer.config import load_config

        return load_config(tiny_config(str(tmp_path / "run"), **sections))

    return make
