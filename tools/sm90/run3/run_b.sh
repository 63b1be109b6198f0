#!/usr/bin/env bash
# Training MFU, run 3, second call: GPU unit tests of bf16_params, a mixed-dtype foreach-copy probe,
# old (ad4e70a) vs new paths side by side, weight sync, and torch.compile over 6 steps.
set -uo pipefail
W=/tmp/run3b; mkdir -p $W/old $W/new $W/compile
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/pydantic*.whl .whl/annotated_types*.whl .whl/typing_inspection*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -c "
import torch; d='cuda'
m=[torch.randn(n, device=d) for n in (1000, 4097, 1<<20, 3)]; p=[x.bfloat16().zero_() for x in m]
torch._foreach_copy_(p, m); print('probe _foreach_copy_ fp32->bf16 on cuda equal to .to(bf16):', all(torch.equal(a, b.bfloat16()) for a, b in zip(p, m)))"
PYTHONPATH=$PWD:/tmp/site timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_actor_bf16_params.py 2>&1 | tail -4
COMMON="--train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 --train-micro 16"
echo "== old path (ad4e70a)"
(cd .oldtrainer && PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -m trainer.bench ceilings train $COMMON --steps 5 \
  --train-chunks 1024 --out $W/old > $W/old/bench.log 2>&1; tail -3 $W/old/bench.log)
echo "== new path"
OUT=$W/new timeout 150 bash tests/gpu/run_all.sh ceilings train sync $COMMON --steps 5 --train-modes bf16,bf16_params \
  --train-chunks 1024,4096 > /dev/null 2>&1; tail -9 $W/new/bench.log
echo "== new path + torch.compile of the decoder layers"
TORCH_LOGS=recompiles PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -m trainer.bench train $COMMON --steps 6 \
  --train-modes bf16_params+compile --train-chunks 4096 --out $W/compile > $W/compile/bench.log 2>&1
grep -c "Recompiling" $W/compile/bench.log; grep -m3 -A3 "Recompiling" $W/compile/bench.log | cut -c1-300; tail -3 $W/compile/bench.log
cp $W/old/bench.log $OUT/old_bench.log; cp $W/new/bench.log $OUT/new_bench.log; cp $W/compile/bench.log $OUT/compile_bench.log
tar czf $OUT/run3b_json.tgz -C $W old new compile
