#!/usr/bin/env bash
# Run 5, call 2 (one H200): where the host time of a slow compiled training step goes. The same compiled
# 1.5B step (20 timed steps) under py-spy (raw stacks, idle samples included) on a cold and then a warm
# inductor cache, with `top` snapshots every 4 s; then warm and cold with inductor's compile worker pool off
# (TORCHINDUCTOR_COMPILE_THREADS=1). Run from the repo root with .whl/ carried (py-spy among the wheels).
set -uo pipefail
W=/tmp/run5b; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
COMMON="--train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 --train-micro 16 --train-chunks 4096 --steps 20"
go() {  # name, py-spy on|off, then environment assignments
  local name=$1 spy=$2; shift 2; echo "== $name"
  ( for i in $(seq 20); do sleep 4; echo "-- t=$((i*4))s"; top -bn1 -w 180 | sed -n 1,22p; done ) > $W/$name.top 2>&1 &
  local tp=$!
  if [ "$spy" = on ]; then
    env "$@" timeout 150 /tmp/site/bin/py-spy record --idle --rate 250 --format raw -o $W/$name.spy -- \
      python3 -m trainer.bench train $COMMON --train-modes bf16_params+compile --out $W/$name > $W/$name.log 2>&1
  else
    env "$@" timeout 120 python3 -m trainer.bench train $COMMON --train-modes bf16_params+compile --out $W/$name > $W/$name.log 2>&1
  fi
  kill $tp 2>/dev/null
  grep -A2 "min_s" $W/$name.log | cut -c1-150
}
go s1_cold on TORCHINDUCTOR_CACHE_DIR=$W/ic1
go s2_warm on TORCHINDUCTOR_CACHE_DIR=$W/ic1
go s3_warm_1thread off TORCHINDUCTOR_CACHE_DIR=$W/ic1 TORCHINDUCTOR_COMPILE_THREADS=1
go s4_cold_1thread off TORCHINDUCTOR_CACHE_DIR=$W/ic2 TORCHINDUCTOR_COMPILE_THREADS=1
rm -rf $W/ic1 $W/ic2
tar czf $OUT/run5_call2.tgz -C $W .
