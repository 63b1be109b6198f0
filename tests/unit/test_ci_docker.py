"""The Docker images agree with the code: ROCm env settings equal `ROCM_DEFAULT_ENV`, bases are
pinned, the arch build args exist, and both images install the project through ci/setup.sh."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from trainer.platform.env import ROCM_DEFAULT_ENV, ROCM_ENV_NOT_SET

dockerfile_parse = pytest.importorskip(
    "dockerfile_parse", reason="dockerfile-parse not installed; `pip install dockerfile-parse`"
)

ROOT = Path(__file__).resolve().parents[2]
ROCM = ROOT / "docker" / "Dockerfile.rocm"
CUDA = ROOT / "docker" / "Dockerfile.cuda"


def _parse(path: Path):  # -> dockerfile_parse.DockerfileParser
    return dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def test_rocm_env_matches_platform_defaults() -> None:
    envs = _parse(ROCM).envs
    expected = {name: value for name, (value, _why) in ROCM_DEFAULT_ENV.items()}
    in_image = {name: envs[name] for name in expected if name in envs}
    assert in_image == expected, "docker/Dockerfile.rocm ENV differs from trainer.platform.env.ROCM_DEFAULT_ENV"
    for name in ROCM_ENV_NOT_SET:
        assert name not in envs, f"{name} is listed as deliberately not set"


def test_rocm_env_names_each_have_a_comment() -> None:
    lines = ROCM.read_text().splitlines()
    for name in ROCM_DEFAULT_ENV:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"ENV {name}="))
        # The ENV line is preceded by a comment (directly, or through the RAY_* pair's shared comment).
        above = [line for line in lines[max(0, index - 2):index] if line.strip()]
        assert any(line.startswith("#") for line in above), f"ENV {name} has no comment saying why"


def test_rocm_arch_build_arg() -> None:
    parser = _parse(ROCM)
    assert parser.args["PYTORCH_ROCM_ARCH"] == "gfx942;gfx950"
    assert parser.envs["PYTORCH_ROCM_ARCH"] == "gfx942;gfx950"  # ENV follows the ARG


@pytest.mark.parametrize("path", [ROCM, CUDA], ids=lambda p: p.name)
def test_base_image_pinned(path: Path) -> None:
    base = _parse(path).baseimage
    assert ":" in base and not base.endswith(":latest"), base


def test_cuda_image_has_no_rocm_settings() -> None:
    parser = _parse(CUDA)
    assert not set(parser.envs) & set(ROCM_DEFAULT_ENV)
    assert parser.args["TORCH_CUDA_ARCH_LIST"] == "9.0"


@pytest.mark.parametrize("path", [ROCM, CUDA], ids=lambda p: p.name)
def test_images_install_through_setup_script(path: Path) -> None:
    runs = [instr["value"] for instr in _parse(path).structure if instr["instruction"] == "RUN"]
    assert any("bash ci/setup.sh" in run and "RLBENCH_EXTRAS=megatron,dev" in run for run in runs)
    # The vllm extra would pull PyPI's CUDA vLLM over the image's own build.
    assert not any("[vllm" in run or ",vllm" in run for run in runs)


def test_hardware_doc_lists_every_rocm_setting() -> None:
    doc = (ROOT / "docs" / "hardware.md").read_text()
    for name, (value, _why) in ROCM_DEFAULT_ENV.items():
        assert f"| `{name}` | `{value}` |" in doc, f"docs/hardware.md lacks the row of {name}"
    for name in ROCM_ENV_NOT_SET:
        assert f"| `{name}` |" in doc
