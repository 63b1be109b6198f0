#!/bin/bash
# One call on the lent nvidia-h200, from the repository root, wheels carried in .whl:
#   bash tools/sm90/moe_actor_call.sh PLAN NEW [BUDGET_S]
# PLAN (comma-separated, run in this order while time is left): micro (the LM-head / grad-add micro-bench, code NEW),
#   actor_old, actor_new (the fsdp2 / megatron actor rows: 8x1024 accum 1 and 8x4096 accum 8, each variant its own
#   process, profiled: tables to $OUT/profiles_{old,new}.txt, Chrome traces of the 8x1024 steps),
#   bare (fsdp2+transformers / megatron at 8x1024 a1, 8x4096 a8, 8x1024 a8, 16x2048 a8),
#   deep_new (the actors at --deep-layers layers, 8x1024 accum 1 and 8), check_new (the parity checks of runs 10-12).
# Code: "old" is the tree's trainer/ (PYTHONPATH=$PWD), "new" is NEW/trainer (PYTHONPATH=$PWD/NEW); NEW may be "."
# (the tree itself). Every bench process: --warmup 2 --steps 3 (the issue's table), Qwen3-30B-A3B width, 4 layers.
# Writes $OUT/log.txt, profiles_*.txt, trace_*.json.gz, and every result JSON packed into $OUT/results.tar.gz.
set -u
PLAN=$1 NEW=$2 BUDGET=${3:-560} OLD=${OLD:-.} DEEP=${DEEP_LAYERS:-8}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + BUDGET))
R=/tmp/res; mkdir -p $R
left() { local l=$((END - SECONDS)); echo $((l < $1 ? l : $1)); }
log() { grep --line-buffered -v -i "warn\|Writing model shards\|USDT\|destroy_process_group" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  PYTHONPATH=/tmp/site python3 -c "import sys,torch,transformers,triton,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,triton.__version__,m.__version__)"
} 2>&1 | log
code() { if [ "$1" = old ]; then echo /tmp/site:$PWD/$OLD; else echo /tmp/site:$PWD/$NEW; fi; }
# one bench process: code tag, name, variant, batch, seq, accum, layers, limit, profile(0/1), trace(0/1)
one() {
  local tag=$1 name=$2 v=$3 b=$4 s=$5 a=$6 L=$7 lim=$8 prof=$9 tr=${10}
  local l=$(left $lim)
  [ "$l" -lt 20 ] && { echo "=== SKIP $tag $name (no time) t=$SECONDS" | log; return; }
  echo "=== $tag $v L$L ${b}x$s accum $a (limit $l s) t=$SECONDS" | log
  local pargs=() env=()
  [ "$prof" = 1 ] && pargs=(--profile "$v") && env=(PROF_OUT=$OUT/profiles_$tag.txt)
  [ "$tr" = 1 ] && env+=(PROF_TRACE=$OUT/trace_${tag}_${v// /_}.json.gz)
  env PYTHONPATH=$(code $tag) "${env[@]}" timeout $l python3 tools/sm90/moe_profile.py --bench --layers $L --batch $b \
    --seq $s --accum $a --warmup 2 --steps 3 --variants "$v" "${pargs[@]}" --out $R/${tag}_$name.json 2>&1 | log
  echo "=== rc ${PIPESTATUS[0]} t=$SECONDS" | log
}
actor() {  # code tag
  one $1 a1_fsdp2_actor "fsdp2 actor" 8 1024 1 4 70 1 1
  one $1 a1_megatron_actor "megatron actor" 8 1024 1 4 70 1 1
  one $1 s4096_fsdp2_actor "fsdp2 actor" 8 4096 8 4 110 1 0
  one $1 s4096_megatron_actor "megatron actor" 8 4096 8 4 110 1 0
}
for step in ${PLAN//,/ }; do
  case $step in
    micro) echo "=== micro t=$SECONDS" | log
      PYTHONPATH=$(code new) timeout $(left 90) python3 tools/sm90/lm_head_bench.py --out $R/micro.json 2>&1 | log ;;
    actor_old) actor old ;;
    actor_new) actor new ;;
    bare)
      for v in megatron fsdp2+transformers; do one old a1_${v//[^a-z0-9]/_} $v 8 1024 1 4 60 0 0; done
      for v in megatron fsdp2+transformers; do one old s4096_${v//[^a-z0-9]/_} $v 8 4096 8 4 90 0 0; done
      for v in megatron fsdp2+transformers; do one old a8_${v//[^a-z0-9]/_} $v 8 1024 8 4 60 0 0; done
      for v in megatron fsdp2+transformers; do one old b16_${v//[^a-z0-9]/_} $v 16 2048 8 4 90 0 0; done ;;
    deep_new)
      for a in 1 8; do for v in "megatron actor" "fsdp2 actor"; do
        one new L${DEEP}_a${a}_${v// /_} "$v" 8 1024 $a $DEEP 90 0 0
      done; done ;;
    check_new) echo "=== check t=$SECONDS" | log
      A=$PWD/reports/sm90/moe_run10 B=$PWD/reports/sm90/moe_run11
      (cd $NEW && PYTHONPATH=/tmp/site:$PWD timeout $(left 120) python3 -m trainer.bench.moe_backends --check \
        $A/reference_sgd.pt,$A/reference_adam_linear.pt,$B/reference_sgd_bf16.pt,$B/reference_adam_linear_bf16.pt \
        --out $R/check.json) 2>&1 | log ;;
  esac
done
echo "=== summary t=$SECONDS" | log
python3 - $R <<'PY' 2>&1 | log
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    if os.path.basename(f) in ("micro.json", "check.json"):
        continue
    for r in json.load(open(f)).get("bench", []):
        if "error" in r:
            print(f"{os.path.basename(f):40s} ERROR {r['error'][:90]}")
        else:
            print(f"{os.path.basename(f):40s} {r['tok_s']:9.0f} tok/s {100 * r['mfu_active']:5.1f}% {r['peak_mem_gib']:6.1f} GiB {r['seconds']:.4f} s")
PY
tar -czf $OUT/results.tar.gz -C $R .
