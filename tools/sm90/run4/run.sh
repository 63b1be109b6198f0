#!/usr/bin/env bash
# Training MFU, run 4 (one H200 call): eager bf16_params vs `actor.compile: true` side by side (8 timed
# steps each, min/median/max, compile time apart, dynamo graph counts, one profiled step each), the
# compiled variant again in a fresh process (warm inductor cache, no ceilings section before it), then
# the GRPO step against TRL. Run from the repo root with .whl/ (pydantic, trl, datasets, dill, multiprocess).
set -uo pipefail
W=/tmp/run4; mkdir -p $W/a $W/b $W/grpo
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee $W/nvidia_smi.txt
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
COMMON="--train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 --train-micro 16 --train-chunks 4096 --steps 8"
echo "== A: eager bf16_params, then actor.compile, one process, ceilings first, one profiled step each"
TORCH_LOGS=recompiles,graph_breaks timeout 130 python3 -m trainer.bench ceilings train $COMMON \
  --train-modes bf16_params,bf16_params+compile --profile --out $W/a > $W/a/bench.log 2>&1
echo "recompile log lines: $(grep -c 'Recompiling' $W/a/bench.log), graph-break lines: $(grep -ci 'graph break' $W/a/bench.log)"
grep -v "^ *[0-9.]* ms\|^V\|^W\|^  " $W/a/bench.log | tail -9
echo "== B: actor.compile again, fresh process (warm inductor cache), no ceilings before it"
timeout 60 python3 -m trainer.bench train $COMMON --train-modes bf16_params+compile --out $W/b > $W/b/bench.log 2>&1
tail -5 $W/b/bench.log
echo "== C: GRPO step, this trainer vs TRL (0.5B, 8x8, 128 + 256 tokens)"
timeout 100 python3 -m trainer.bench grpo --out $W/grpo > $W/grpo/bench.log 2>&1
tail -6 $W/grpo/bench.log
cp $W/a/bench.log $OUT/a_bench.log; cp $W/b/bench.log $OUT/b_bench.log; cp $W/grpo/bench.log $OUT/grpo_bench.log
tar czf $OUT/run4_json.tgz -C $W .
