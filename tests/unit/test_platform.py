"""Platform detection fed with the facts of ROCm, CUDA and CPU machines (no GPU needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainer.errors import ConfigError
from trainer.platform.env import (
    ENV_FLAG_PATTERNS,
    KNOWN_DEVICES,
    ROCM_DEFAULT_ENV,
    ROCM_ENV_NOT_SET,
    DeviceFacts,
    apply_rocm_env,
    collect_env,
    detect_arch,
    env_flags,
    git_state,
    normalize_device_name,
    peak_bf16_tflops,
    rocm_env_for_engine,
)

MI300X = DeviceFacts(
    hip_version="6.4.43482-0f2d60242",
    num_gpus=8,
    device_name="AMD Instinct MI300X",
    gcn_arch_name="gfx942:sramecc+:xnack-",
    capability=(9, 4),  # what torch reports on ROCm; must not turn into "sm_94"
)
MI355X = DeviceFacts(
    hip_version="7.0.51831-a3e329ad8",
    num_gpus=8,
    device_name="AMD Instinct MI355X",
    gcn_arch_name="gfx950:sramecc+:xnack-",
    capability=(9, 5),
)
# As probed on an H200 with torch 2.11 (CUDA 13.0): CUDA builds fill gcnArchName with the device name.
H200 = DeviceFacts(
    cuda_version="12.8", num_gpus=2, device_name="NVIDIA H200", gcn_arch_name="NVIDIA H200", capability=(9, 0)
)
CPU = DeviceFacts(cuda_version=None, hip_version=None)


# ----------------------------------------------------------------------------- arch and device
@pytest.mark.parametrize(
    ("facts", "arch", "backend"),
    [(MI300X, "gfx942", "rocm"), (MI355X, "gfx950", "rocm"), (H200, "sm_90", "cuda"), (CPU, "cpu", "cpu")],
)
def test_detect_arch(facts: DeviceFacts, arch: str, backend: str) -> None:
    assert detect_arch(facts) == arch
    assert facts.backend == backend


def test_detect_arch_edge_cases() -> None:
    # A CUDA or ROCm torch build on a machine without GPUs is a CPU machine.
    assert detect_arch(DeviceFacts(cuda_version="12.8", num_gpus=0)) == "cpu"
    assert detect_arch(DeviceFacts(hip_version="7.0", num_gpus=0)) == "cpu"
    # gcnArchName without feature suffix, and A100 capability (8, 0).
    assert detect_arch(DeviceFacts(hip_version="6.3", num_gpus=1, gcn_arch_name="gfx90a")) == "gfx90a"
    assert detect_arch(DeviceFacts(cuda_version="12.4", num_gpus=1, capability=(8, 0))) == "sm_80"
    # Container hides gcnArchName: the device table supplies the arch of a known name.
    hidden = DeviceFacts(hip_version="7.0", num_gpus=1, device_name="AMD Instinct MI325X", gcn_arch_name=None)
    assert detect_arch(hidden) == "gfx942"
    generic = DeviceFacts(hip_version="7.0", num_gpus=1, device_name="AMD Radeon Graphics")
    assert detect_arch(generic) == "unknown"


@pytest.mark.parametrize(
    ("raw", "short"),
    [
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI308X", "MI308X"),
        ("AMD Instinct MI325X", "MI325X"),
        ("AMD Instinct MI350X", "MI350X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("  AMD Radeon Graphics ", "AMD Radeon Graphics"),  # unknown: kept, stripped
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ],
)
def test_normalize_device_name(raw: str, short: str) -> None:
    assert normalize_device_name(raw) == short


def test_device_table_arches() -> None:
    assert {n for n, s in KNOWN_DEVICES.items() if s.arch == "gfx942"} == {"MI300X", "MI300A", "MI308X", "MI325X"}
    assert {n for n, s in KNOWN_DEVICES.items() if s.arch == "gfx950"} == {"MI350X", "MI355X"}
    assert KNOWN_DEVICES["H200"].arch == "sm_90" and KNOWN_DEVICES["A100"].arch == "sm_80"


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("AMD Instinct MI300X", 1307.0),
        ("MI325X", 1307.0),
        ("AMD Instinct MI350X", 2300.0),
        ("AMD Instinct MI355X", 2500.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H20", 148.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
    ],
)
def test_peak_bf16_tflops(name: str, tflops: float) -> None:
    assert peak_bf16_tflops(name) == tflops


def test_peak_bf16_override_and_unknown() -> None:
    assert peak_bf16_tflops("NVIDIA GeForce RTX 4090", override=165.2) == 165.2
    assert peak_bf16_tflops("AMD Instinct MI300X", override=1000) == 1000.0  # override wins
    with pytest.raises(ConfigError, match="RTX 4090.*override"):
        peak_bf16_tflops("NVIDIA GeForce RTX 4090")
    with pytest.raises(ConfigError, match="MI308X"):  # known device, no vendor figure recorded
        peak_bf16_tflops("AMD Instinct MI308X")
    with pytest.raises(ConfigError, match="positive"):
        peak_bf16_tflops("H200", override=0)


# ----------------------------------------------------------------------------- ROCm env
def test_rocm_env_only_on_rocm() -> None:
    env: dict[str, str] = {}
    assert apply_rocm_env(env, is_rocm=False, engine="vllm") == {}
    assert env == {}


def test_rocm_env_vllm_sets_vllm_switches_not_sglang() -> None:
    env: dict[str, str] = {"PATH": "/usr/bin"}
    applied = apply_rocm_env(env, is_rocm=True, engine="vllm")
    assert applied["VLLM_ROCM_USE_AITER"] == "1"
    assert applied["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert applied["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"
    assert applied["RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES"] == "1"
    assert applied["TORCH_NCCL_HIGH_PRIORITY"] == "1"
    assert "SGLANG_USE_AITER" not in applied
    assert env["PATH"] == "/usr/bin"
    assert env == {"PATH": "/usr/bin", **applied}  # returned dict is exactly what was set


def test_rocm_env_sglang_and_hf() -> None:
    sgl = apply_rocm_env({}, is_rocm=True, engine="sglang")
    assert sgl["SGLANG_USE_AITER"] == "1"
    assert not any(name.startswith("VLLM_") for name in sgl)
    hf = apply_rocm_env({}, is_rocm=True, engine="hf")
    assert not any(name.startswith(("VLLM_", "SGLANG_")) for name in hf)
    assert hf["HSA_NO_SCRATCH_RECLAIM"] == "1"
    # Every default lands for exactly the engines it belongs to.
    union = set(sgl) | set(apply_rocm_env({}, is_rocm=True, engine="vllm"))
    assert union == set(ROCM_DEFAULT_ENV)


def test_rocm_env_user_settings_win() -> None:
    env = {"VLLM_ROCM_USE_AITER": "0", "HSA_NO_SCRATCH_RECLAIM": "", "NCCL_MIN_NCHANNELS": "32"}
    applied = apply_rocm_env(env, is_rocm=True, engine="vllm")
    assert env["VLLM_ROCM_USE_AITER"] == "0"
    assert env["HSA_NO_SCRATCH_RECLAIM"] == ""  # set-but-empty is still the user's choice
    assert env["NCCL_MIN_NCHANNELS"] == "32"
    assert not {"VLLM_ROCM_USE_AITER", "HSA_NO_SCRATCH_RECLAIM", "NCCL_MIN_NCHANNELS"} & set(applied)
    assert applied["VLLM_ROCM_USE_AITER_MOE"] == "1"
    # Applying twice sets nothing new.
    assert apply_rocm_env(env, is_rocm=True, engine="vllm") == {}


def test_rocm_env_unknown_engine() -> None:
    with pytest.raises(ConfigError, match="rollout.engine.*'trtllm'"):
        apply_rocm_env({}, is_rocm=False, engine="trtllm")
    with pytest.raises(ConfigError):
        rocm_env_for_engine("VLLM")


def test_rocm_env_table_is_documented() -> None:
    for name, (value, why) in ROCM_DEFAULT_ENV.items():
        assert value and len(why) > 20, name
    assert "PYTORCH_ALLOC_CONF" in ROCM_ENV_NOT_SET and "PYTORCH_ALLOC_CONF" not in ROCM_DEFAULT_ENV
    # Every default is also recorded by collect_env's flag filter.
    assert set(env_flags({name: v for name, (v, _) in ROCM_DEFAULT_ENV.items()})) == set(ROCM_DEFAULT_ENV)


# ----------------------------------------------------------------------------- environment record
def test_env_flags_filter() -> None:
    environ = {
        "VLLM_ROCM_USE_AITER": "1",
        "VLLM_USE_AITER_UNIFIED_ATTENTION": "1",
        "SGLANG_USE_AITER": "1",
        "SGLANG_AITER_MLA": "1",
        "AITER_LOG_MORE": "1",
        "HSA_NO_SCRATCH_RECLAIM": "1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "ROCR_VISIBLE_DEVICES": "0",
        "CUDA_VISIBLE_DEVICES": "1",
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_HIP_ALLOC_CONF": "x",
        "NCCL_DEBUG": "INFO",
        "RCCL_MSCCL_ENABLE": "0",
        "TORCH_NCCL_HIGH_PRIORITY": "1",
        # not recorded
        "HOME": "/root",
        "VLLM_LOGGING_LEVEL": "INFO",
        "SGLANG_HOST": "x",
        "MY_HSA_THING": "1",
        "HF_TOKEN": "secret",
    }
    got = env_flags(environ)
    assert set(got) == set(list(environ)[:15])
    assert list(got) == sorted(got)
    assert ENV_FLAG_PATTERNS  # non-empty


def test_git_state(tmp_path: Path) -> None:
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    (repo / "a.txt").write_text("1\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "one")
    clean = git_state(repo)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (repo / "a.txt").write_text("2\n")
    assert git_state(repo) == {"commit": clean["commit"], "dirty": True}


def test_collect_env_rocm(tmp_path: Path) -> None:
    version_file = tmp_path / "version"
    version_file.write_text("7.0.2\n")
    env = collect_env(
        facts=MI355X,
        environ={"VLLM_ROCM_USE_AITER": "1", "HOME": "/root"},
        repo_root=tmp_path,
        rocm_version_file=version_file,
    )
    assert env["arch"] == "gfx950" and env["backend"] == "rocm"
    assert env["device_name"] == "MI355X" and env["device_name_raw"] == "AMD Instinct MI355X"
    assert env["num_gpus"] == 8
    assert env["rocm_version"] == "7.0.2" and env["cuda_version"] is None
    assert env["env_flags"] == {"VLLM_ROCM_USE_AITER": "1"}
    assert env["git"] == {"commit": None, "dirty": None}
    assert env["versions"]["torch"] is not None and "vllm" in env["versions"]
    assert "megatron-core" in env["versions"] and "sglang" in env["versions"]
    assert env["date_utc"].endswith("+00:00")
    assert isinstance(env["cpu_count"], int) and env["hostname"]


def test_collect_env_cuda_and_cpu(tmp_path: Path) -> None:
    cuda = collect_env(facts=H200, environ={}, repo_root=tmp_path, rocm_version_file=tmp_path / "none")
    assert (cuda["arch"], cuda["backend"], cuda["device_name"], cuda["cuda_version"]) == (
        "sm_90", "cuda", "H200", "12.8")
    assert cuda["rocm_version"] is None
    cpu = collect_env(facts=CPU, environ={}, repo_root=tmp_path)
    assert (cpu["arch"], cpu["backend"], cpu["device_name"], cpu["num_gpus"]) == ("cpu", "cpu", None, 0)
