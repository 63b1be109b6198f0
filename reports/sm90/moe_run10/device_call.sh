#!/bin/bash
# One call on the lent nvidia-h200 (run from the repository root, wheels carried in .whl):
#   1. parity with the CPU references of this folder: Adam (fp32, bf16) and SGD (fp32, bf16, bf16 broken on purpose)
#   2. the single-process colocated loop with actor.strategy=megatron on CUDA, resume vs uninterrupted
#   3. MFU: Megatron and FSDP2 + transformers, each variant in its own process
# Writes $OUT/log.txt, $OUT/check.json and $OUT/res.tgz (loop summary and metrics, benchmark json).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/res
mkdir -p $R/bench
pack() { (cd $R && tar czf $OUT/res.tgz --exclude='checkpoints' --exclude='*.pt' .); }
log() { grep --line-buffered -v -i "warn\|Writing model shards" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys,torch,transformers,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,m.__version__)"
} 2>&1 | log
D=reports/sm90/moe_run10
timeout 150 python3 -m trainer.bench.moe_backends --check $D/reference_adam.pt,$D/reference_sgd.pt --out $OUT/check.json 2>&1 | log
timeout 210 python3 reports/sm90/megatron_loop_gpu.py --out $R/loop 2>&1 | log
pack
for shape in "8 2048 8" "8 1024 32"; do
  set -- $shape
  for v in megatron fsdp2+transformers; do
    timeout 100 python3 -m trainer.bench.moe_backends --bench --layers 4 --batch $1 --seq $2 --accum $3 --warmup 2 \
      --steps 3 --variants "$v" --out $R/bench/L4_b$1_s$2_a$3_${v//[^a-z0-9]/_}.json 2>&1 | log
    pack
  done
done
