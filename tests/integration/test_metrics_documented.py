"""Every metric the trainer logs is documented in docs/metrics.md (one table for all of them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainer.api import train
from trainer.components.metrics import read_metrics

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented_patterns() -> list[re.Pattern[str]]:
    """Regexes for the names in the doc's tables: `a/b/{x,y}`, `a/b/x`, `/y` (same prefix), `<ds>`, `@N`, `<i>`."""
    patterns, prev = [], ""
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        for name in re.findall(r"`([^`]+)`", cell):
            if name.startswith("/"):
                name = prev.rsplit("/", 1)[0] + name
            prev = name
            braces = re.search(r"\{([^}]+)\}", name)
            names = [name[:braces.start()] + alt + name[braces.end():] for alt in braces.group(1).split(",")] \
                if braces else [name]
            for n in names:
                rx = re.escape(n).replace("<data_source>", ".+").replace("@N", r"@\d+").replace("<i>", r"\d+")
                patterns.append(re.compile(rx + "$"))
    return patterns


def test_every_logged_metric_is_documented(make_config):
    cfg = make_config(algorithm={"name": "ppo", "adv_estimator": "gae"}, critic={"enable": True},
                      actor={"use_kl_loss": True, "tis_cap": 2.0, "ppo_mini_batch_size": 2},
                      trainer={"total_steps": 2, "test_freq": 1, "save_freq": 2})
    names = {k for line in read_metrics(train(cfg)) for k in line["data"]}
    patterns = documented_patterns()
    missing = sorted(n for n in names if not any(p.match(n) for p in patterns))
    assert not missing, f"document these in docs/metrics.md: {missing}"
    assert len(names) > 40
