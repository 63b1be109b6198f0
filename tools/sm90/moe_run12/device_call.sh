#!/bin/bash
# One call on the lent nvidia-h200 (run from the repository root, wheels carried in .whl), within ~420 s:
# the GPU path again after the Megatron backend gained sequence / pipeline parallelism, the alltoall
# dispatcher on every device and the per-micro-batch loss hook (none of which one GPU can exercise beyond
# TP = PP = EP = 1): the same parity checks as run 11 against runs 10 and 11's CPU references, and the
# single-process colocated loop on megatron's DDP + distributed optimizer with resume, as run 10's call 3.
# Writes $OUT/log.txt, $OUT/check.json and $OUT/loop/ (summary.json and each run's metrics.jsonl).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + 420))
left() { local l=$((END - SECONDS)); echo $((l < $1 ? l : $1)); }
log() { grep --line-buffered -v -i "warn\|Writing model shards" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys,torch,transformers,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,m.__version__)"
  git log -1 --format='commit %H' 2>/dev/null || true
} 2>&1 | log
A=reports/sm90/moe_run10 B=reports/sm90/moe_run11
echo "=== check t=$SECONDS" | log
timeout $(left 120) python3 -m trainer.bench.moe_backends --check \
  $A/reference_sgd.pt,$A/reference_adam_linear.pt,$B/reference_sgd_bf16.pt,$B/reference_adam_linear_bf16.pt \
  --out $OUT/check.json 2>&1 | log
echo "=== loop t=$SECONDS (limit $(left 280) s)" | log
timeout $(left 280) python3 tools/sm90/megatron_loop_gpu.py --out $OUT/loop 2>&1 | log
echo "=== done rc ${PIPESTATUS[0]} t=$SECONDS" | log
rm -rf $OUT/loop/*/checkpoints 2>/dev/null; find $OUT -name '*.pt' -delete
