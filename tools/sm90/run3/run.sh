#!/usr/bin/env bash
# Training MFU, run 3: the previous code (commit ad4e70a, unpacked into .oldtrainer/) and this
# commit's code side by side on one H200, 1.5B shape, 16 x 1024 tokens. Run from the repo root
# with .whl/ (pydantic) and .oldtrainer/ (`git archive ad4e70a trainer | tar -x -C .oldtrainer`) present.
set -uo pipefail
W=/tmp/run3; mkdir -p $W/old $W/new $W/compile
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/pydantic*.whl .whl/annotated_types*.whl .whl/typing_inspection*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
COMMON="--train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 --train-micro 16 --steps 3"
echo "== old path (ad4e70a): autocast, foreach AdamW, checkpointed LM-head chunks"
(cd .oldtrainer && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m trainer.bench ceilings train $COMMON \
  --train-chunks 1024 --out $W/old > $W/old/bench.log 2>&1; tail -4 $W/old/bench.log)
echo "== new path: bf16 (autocast) and bf16_params, chunks 1024 and 4096, profiled; weight sync"
OUT=$W/new timeout 200 bash tests/gpu/run_all.sh ceilings train sync $COMMON --train-modes bf16,bf16_params \
  --train-chunks 1024,4096 --profile > /dev/null 2>&1; tail -12 $W/new/bench.log
echo "== new path + torch.compile of the decoder layers"
PYTHONPATH=$PWD:/tmp/site timeout 80 python3 -m trainer.bench ceilings train $COMMON --train-modes bf16_params+compile \
  --train-chunks 4096 --out $W/compile > $W/compile/bench.log 2>&1; tail -4 $W/compile/bench.log
cp $W/old/bench.log $OUT/old_bench.log; cp $W/new/bench.log $OUT/new_bench.log; cp $W/compile/bench.log $OUT/compile_bench.log
tar czf $OUT/run3_json.tgz -C $W old new compile
