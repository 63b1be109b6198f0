#!/bin/bash
# One call on the lent nvidia-h200 (run 16): the Megatron actor step's fixed costs, before / after, in one call.
#   bash tools/sm90/moe_fixed_cost_call.sh [BUDGET_S]
# Code trees (carried, ignored): .oldtrainer = commit d072120's trainer/ (its bench: the issue's numbers),
# .oldfix = d072120's trainer/ with this change's bench only (actor.strategy=megatron: no loss witness, as the
# loops run it), "new" = the working tree. Wheels in .whl (megatron-core 0.19.2, mbridge 0.15.1, pydantic ...).
# Every bench process: Qwen3-30B-A3B width, 4 layers, --warmup 2 --steps 10, its own process.
# Order: GPU checks, the 8x1024 accum-1 Megatron actor old / oldfix / new (profiled: tables + Chrome traces),
# then new / oldfix / old again, the parity check (runs 10-11 references) with the new code, then 8x4096 accum 8.
set -u
BUDGET=${1:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + BUDGET))
R=/tmp/res; mkdir -p $R
left() { local l=$((END - SECONDS)); echo $((l < $1 ? l : $1)); }
log() { grep --line-buffered -v -i "warn\|Writing model shards\|USDT\|destroy_process_group" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  PYTHONPATH=/tmp/site python3 -c "import sys,torch,transformers,triton,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,triton.__version__,m.__version__)"
} 2>&1 | log
code() { case $1 in old) echo /tmp/site:$PWD/.oldtrainer ;; oldfix) echo /tmp/site:$PWD/.oldfix ;; *) echo /tmp/site:$PWD ;; esac; }
# one bench process: code tag, run name, variant, batch, seq, accum, limit, profile(0/1)
one() {
  local tag=$1 name=$2 v=$3 b=$4 s=$5 a=$6 lim=$7 prof=$8
  local l=$(left $lim)
  [ "$l" -lt 25 ] && { echo "=== SKIP $tag $name (no time) t=$SECONDS" | log; return; }
  echo "=== $tag $v L4 ${b}x$s accum $a (limit $l s) t=$SECONDS" | log
  local pargs=() env=()
  [ "$prof" = 1 ] && pargs=(--profile "$v") && env=(PROF_OUT=$OUT/profiles_$tag.txt PROF_TRACE=$OUT/trace_$tag.json.gz)
  env PYTHONPATH=$(code $tag) "${env[@]}" timeout $l python3 tools/sm90/moe_profile.py --bench --layers 4 --batch $b \
    --seq $s --accum $a --warmup 2 --steps 10 --variants "$v" "${pargs[@]}" --out $R/${name}.json 2>&1 | log
  echo "=== rc ${PIPESTATUS[0]} t=$SECONDS" | log
}
echo "=== gpu checks t=$SECONDS" | log
PYTHONPATH=$(code new) timeout $(left 60) python3 tools/sm90/fixed_cost_gpu_check.py --out $R/gpu_check.json 2>&1 | log
M="megatron actor"
one old a1_old_1 "$M" 8 1024 1 60 1
one oldfix a1_oldfix_1 "$M" 8 1024 1 60 1
one new a1_new_1 "$M" 8 1024 1 60 1
one new a1_new_2 "$M" 8 1024 1 50 0
one oldfix a1_oldfix_2 "$M" 8 1024 1 50 0
one old a1_old_2 "$M" 8 1024 1 50 0
echo "=== check t=$SECONDS" | log
A=$PWD/reports/sm90/moe_run10 B=$PWD/reports/sm90/moe_run11
PYTHONPATH=$(code new) timeout $(left 90) python3 -m trainer.bench.moe_backends --check \
  $A/reference_sgd.pt,$A/reference_adam_linear.pt,$B/reference_sgd_bf16.pt,$B/reference_adam_linear_bf16.pt \
  --out $R/check.json 2>&1 | log
one new s4096_new "$M" 8 4096 8 100 0
one old s4096_old "$M" 8 4096 8 100 0
echo "=== summary t=$SECONDS" | log
python3 - $R <<'PY' 2>&1 | log
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    if os.path.basename(f) in ("gpu_check.json", "check.json"):
        continue
    for r in json.load(open(f)).get("bench", []):
        if "error" in r:
            print(f"{os.path.basename(f):28s} ERROR {r['error'][:90]}")
        else:
            print(f"{os.path.basename(f):28s} {r['tok_s']:9.0f} tok/s {100 * r['mfu_active']:5.1f}% {r['peak_mem_gib']:6.1f} GiB "
                  f"{1000 * r['seconds']:8.2f} ms grad_norm {r['grad_norm']}")
PY
tar -czf $OUT/results.tar.gz -C $R .
