"""Every shipped trainer config validates and starts with what it does and the command that runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "trainer" / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates_and_documents_its_command(path):
    load_config(path)
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    assert header and header[0].startswith("# "), f"{path.name}: start with a comment saying what it does"
    assert any(f"python -m trainer trainer/configs/{path.name}" in ln for ln in header), \
        f"{path.name}: the header must give the command that runs it"
