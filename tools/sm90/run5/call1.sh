#!/usr/bin/env bash
# Run 5, call 1 (one H200): why does `actor.compile` training run 0.33 s/step in one process and 0.44 s in
# another? Five processes of the same compiled 1.5B step with inductor's cache controlled (cold dir, warm dir,
# warm dir with the FX-graph and AOT-autograd caches off, after an eager variant in the same process, a
# second cold dir), each with a kernel profile of one step (kernel sum vs wall). Run from the repo root with
# .whl/ carried.
set -uo pipefail
W=/tmp/run5; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee $W/nvidia_smi.txt
COMMON="--train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 --train-micro 16 --train-chunks 4096 --steps 8 --profile"
clocks() { nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader >> $W/clocks.txt; }
go() {  # name, train modes, then environment assignments
  local name=$1 modes=$2; shift 2; echo "== $name"; clocks
  env "$@" timeout 120 python3 -m trainer.bench train $COMMON --train-modes $modes --out $W/$name > $W/$name.log 2>&1
  grep -A3 "min_s" $W/$name.log | cut -c1-200
}
C=bf16_params+compile
go p1_cold $C TORCHINDUCTOR_CACHE_DIR=$W/ic1
go p2_warm $C TORCHINDUCTOR_CACHE_DIR=$W/ic1
go p3_nofx $C TORCHINDUCTOR_CACHE_DIR=$W/ic1 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
go p4_eager_first bf16_params,$C TORCHINDUCTOR_CACHE_DIR=$W/ic1
go p5_cold2 $C TORCHINDUCTOR_CACHE_DIR=$W/ic2
clocks
rm -rf $W/ic1 $W/ic2
tar czf $OUT/run5_call1.tgz -C $W .
