#!/usr/bin/env bash
# All GPU benchmarks in one device call. Writes JSON + the log into $OUT (or ./outputs/bench).
# Needs TRL for the side-by-side: carry .whl (trl, datasets, dill, multiprocess) when the image lacks it.
set -uo pipefail
OUT=${OUT:-outputs/bench}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import trl" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -m trainer.bench "$@" --out "$OUT" 2>&1 | tee "$OUT/bench.log"
# the device returns at most 8 files: pack the per-section JSON into one archive
(cd "$OUT" && tar czf bench_json.tgz *.json && rm -f *.json)
