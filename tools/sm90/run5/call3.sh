#!/usr/bin/env bash
# Run 5, call 3 (one H200), the code with inductor's compile worker pool off (trainer/backends/compile.py):
# (1) compiled 1.5B training in three processes (cold inductor cache, then warm twice), default environment;
# (2) the GRPO step side by side with TRL's GRPOTrainer, this trainer in three variants;
# (3) static-engine rollout without and with compile_decode. Run from the repo root with .whl/ carried.
set -uo pipefail
W=/tmp/run5c; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=$W/ic
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee $W/nvidia_smi.txt
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)" | tee $W/versions.txt
COMMON="--train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 --train-micro 16 --train-chunks 4096 --steps 8"
for name in t1_cold t2_warm t3_warm; do
  echo "== $name"
  timeout 80 python3 -m trainer.bench ceilings train $COMMON --train-modes bf16_params+compile --out $W/$name > $W/$name.log 2>&1
  grep -B1 -A2 "min_s\|tok_s" $W/$name.log | grep -v "^--" | cut -c1-200
done
echo "== grpo: this trainer (3 variants) vs TRL"
timeout 240 python3 -m trainer.bench grpo --grpo-steps 5 --grpo-chunk 4096 \
  --grpo-modes bf16,bf16_params+compile_decode,bf16_params+compile+compile_decode --out $W/grpo > $W/grpo.log 2>&1
grep -v "it/s\]\|^{'loss'" $W/grpo.log | tail -14 | cut -c1-400
for v in eager compiled; do
  echo "== rollout $v"
  flag=""; [ $v = compiled ] && flag=--compile-decode
  timeout 70 python3 -m trainer.bench ceilings rollout $flag --out $W/roll_$v > $W/roll_$v.log 2>&1
  tail -5 $W/roll_$v.log
done
rm -rf $W/ic
tar czf $OUT/run5_call3.tgz -C $W .
