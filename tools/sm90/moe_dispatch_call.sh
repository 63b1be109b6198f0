#!/bin/bash
# One call on a lent one-GPU machine (H100 or H200): the Megatron MoE actor with megatron's alltoall token dispatcher
# against the local one (trainer/backends/megatron/dispatch.py), with the FSDP2 actor beside, all in one call.
#   COMMIT=$(git rev-parse HEAD) bash tools/sm90/moe_dispatch_call.sh [BUDGET_S]
# Wheels in .whlm (megatron-core 0.19.2, mbridge 0.15.1, einops, pydantic and its helpers).
# Order, while time is left: the one-layer GPU check (tools/sm90/dispatch_gpu_check.py: host syncs, error against
# fp32, layer time); the actor rows at 8x1024 accum 1 (alltoall, local, fsdp2) and 8x4096 accum 8 (alltoall,
# local, fsdp2, then both backends with actor.lm_head_keep_logits), each variant a process of its own (--warmup 2
# --steps 3, Qwen3-30B-A3B width, 4 layers, the issue's table); the parity checks of runs 10-11 with the new code;
# the 8x1024 rows again. Writes $OUT/log.txt, every JSON in $OUT/results.tar.gz.
set -u
BUDGET=${1:-560}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlm/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + BUDGET))
R=/tmp/res; mkdir -p $R
left() { local l=$((END - SECONDS)); echo $((l < $1 ? l : $1)); }
log() { grep --line-buffered -v -i "warn\|Writing model shards\|USDT\|destroy_process_group" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  echo "commit ${COMMIT:-unknown}"
  python3 -c "import sys,torch,transformers,triton,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,triton.__version__,m.__version__)"
} 2>&1 | log
# one bench process: name, variant, batch, seq, accum, limit
one() {
  local name=$1 v=$2 b=$3 s=$4 a=$5 lim=$6
  local l=$(left $lim)
  [ "$l" -lt 25 ] && { echo "=== SKIP $name (no time) t=$SECONDS" | log; return; }
  echo "=== $v L4 ${b}x$s accum $a (limit $l s) t=$SECONDS" | log
  timeout $l python3 -m trainer.bench.moe_backends --bench --layers 4 --batch $b --seq $s --accum $a \
    --warmup 2 --steps 3 --variants "$v" --out $R/$name.json 2>&1 | log
  echo "=== rc ${PIPESTATUS[0]} t=$SECONDS" | log
}
echo "=== dispatch gpu check t=$SECONDS" | log
timeout $(left 100) python3 tools/sm90/dispatch_gpu_check.py --out $R/dispatch_check.json 2>&1 | log
one a1_alltoall "megatron actor alltoall" 8 1024 1 60
one a1_local "megatron actor" 8 1024 1 60
one a1_fsdp2 "fsdp2 actor" 8 1024 1 60
one s4096_alltoall "megatron actor alltoall" 8 4096 8 90
one s4096_local "megatron actor" 8 4096 8 90
one s4096_fsdp2 "fsdp2 actor" 8 4096 8 90
# kept logits at 8 x 4096: 9.7 GB more per micro-batch over a 73.5 GiB peak, more than an H100 holds
if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]; then
  one s4096_local_keep "megatron actor keep logits" 8 4096 8 90
  one s4096_fsdp2_keep "fsdp2 actor keep logits" 8 4096 8 90
else
  echo "=== SKIP the 8x4096 kept-logits rows (under 100 GB of GPU memory)" | log
fi
one a1_local_keep "megatron actor keep logits" 8 1024 1 60
echo "=== check t=$SECONDS" | log
A=$PWD/reports/sm90/moe_run10 B=$PWD/reports/sm90/moe_run11
timeout $(left 90) python3 -m trainer.bench.moe_backends --check \
  $A/reference_sgd.pt,$A/reference_adam_linear.pt,$B/reference_sgd_bf16.pt,$B/reference_adam_linear_bf16.pt \
  --out $R/check.json 2>&1 | log
one a1_fsdp2_keep "fsdp2 actor keep logits" 8 1024 1 60
one a1_local_2 "megatron actor" 8 1024 1 50
one a1_alltoall_2 "megatron actor alltoall" 8 1024 1 50
echo "=== summary t=$SECONDS" | log
python3 - $R <<'PY' 2>&1 | log
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    if os.path.basename(f) in ("dispatch_check.json", "check.json"):
        continue
    for r in json.load(open(f)).get("bench", []):
        if "error" in r:
            print(f"{os.path.basename(f):24s} ERROR {r['error'][:90]}")
        else:
            print(f"{os.path.basename(f):24s} {r['tok_s']:9.0f} tok/s {100 * r['mfu_active']:5.1f}% {r['peak_mem_gib']:6.1f} GiB "
                  f"{r['seconds']:.4f} s {r.get('dispatcher', '')}")
PY
tar -czf $OUT/results.tar.gz -C $R .
