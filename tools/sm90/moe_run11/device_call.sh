#!/bin/bash
# One call on the lent nvidia-h200 (run from the repository root, wheels carried in .whl), within ~330 s:
#   1. parity: SGD and Adam with beta1=0, eps=1000 against run 10's fp32 CPU references (GPU fp32, bf16, bf16 with a
#      3%-too-large step) and against this folder's CPU bf16 references (GPU bf16, bf16 with a 3%-too-large step)
#   2. MFU at larger micro-batches, accum 8: Megatron and FSDP2 + transformers, each variant in its own process
# Writes $OUT/log.txt, $OUT/check.json and one benchmark json per variant.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + 330))
left() { local l=$((END - SECONDS)); echo $((l < $1 ? l : $1)); }
log() { grep --line-buffered -v -i "warn\|Writing model shards" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys,torch,transformers,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,m.__version__)"
} 2>&1 | log
A=reports/sm90/moe_run10 B=reports/sm90/moe_run11
timeout $(left 100) python3 -m trainer.bench.moe_backends --check \
  $A/reference_sgd.pt,$A/reference_adam_linear.pt,$B/reference_sgd_bf16.pt,$B/reference_adam_linear_bf16.pt \
  --out $OUT/check.json 2>&1 | log
for cfg in "8 4096" "16 2048"; do
  set -- $cfg
  for v in megatron fsdp2+transformers; do
    echo "=== bench $v batch $1 seq $2 accum 8 (limit $(left 80) s) t=$SECONDS" | log
    timeout $(left 80) python3 -m trainer.bench.moe_backends --bench --layers 4 --batch $1 --seq $2 --accum 8 \
      --warmup 2 --steps 3 --variants "$v" --out $OUT/L4_b$1_s$2_a8_${v//[^a-z0-9]/_}.json 2>&1 | log
    echo "=== rc ${PIPESTATUS[0]} t=$SECONDS" | log
  done
done
