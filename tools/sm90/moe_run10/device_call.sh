#!/bin/bash
# One call on the lent nvidia-h200 (run from the repository root, wheels carried in .whl):
#   1. parity with the CPU references of this folder: Adam (fp32, bf16); SGD and Adam with beta1=0, eps=1 (a step
#      proportional to the gradient) each in fp32, bf16 and bf16 broken on purpose
#   2. the single-process colocated loop with actor.strategy=megatron on CUDA, resume vs uninterrupted
#   3. MFU: Megatron and FSDP2 + transformers, each variant in its own process
# Writes $OUT/log.txt, $OUT/check.json and $OUT/res.tgz (loop summary and metrics, benchmark json).
# Arguments: the stages to run, of check, loop, loop_torch (the loop with actor.megatron.optimizer=torch), bench;
# none: check loop bench.
set -u
STAGES=" ${*:-check loop bench} "
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/res
mkdir -p $R/bench
pack() { (cd $R && tar czf $OUT/res.tgz --exclude='checkpoints' --exclude='*.pt' .); }
log() { grep --line-buffered -v -i "warn\|Writing model shards" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys,torch,transformers,megatron.core as m;print(sys.version.split()[0],torch.__version__,transformers.__version__,m.__version__)"
} 2>&1 | log
D=reports/sm90/moe_run10
[[ $STAGES == *" check "* ]] && timeout 200 python3 -m trainer.bench.moe_backends --check $D/reference_adam.pt,$D/reference_sgd.pt,$D/reference_adam_linear.pt --out $OUT/check.json 2>&1 | log
[[ $STAGES == *" loop "* ]] && timeout 210 python3 tools/sm90/megatron_loop_gpu.py --out $R/loop 2>&1 | log
[[ $STAGES == *" loop_torch "* ]] && timeout 210 python3 tools/sm90/megatron_loop_gpu.py --out $R/loop_torch \
  --optimizer torch 2>&1 | log
pack
[[ $STAGES == *" bench "* ]] && for v in megatron fsdp2+transformers; do  # 4 layers, 8 micro-batches of 8 x 2048 tokens per optimizer step
  timeout 240 python3 -m trainer.bench.moe_backends --bench --layers 4 --batch 8 --seq 2048 --accum 8 --warmup 2 \
    --steps 3 --variants "$v" --out $R/bench/L4_b8_s2048_a8_${v//[^a-z0-9]/_}.json 2>&1 | log
  pack
done
