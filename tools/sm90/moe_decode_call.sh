#!/bin/bash
# One call on a lent one-GPU machine (H100 or H200), from the repository root, wheels carried in .whl (as
# tools/sm90/moe_grpo_call.sh needs them):
#   COMMIT=$(git rev-parse HEAD) [LAYERS="4"] bash tools/sm90/moe_decode_call.sh [BUDGET_S]
# 1. tools/sm90/moe_decode_bench.py: one MoE layer's decode step at the GRPO bench's shape, the fused Triton block
#    (trainer/ops/moe_decode.py) against transformers' block, correctness against fp64, the block-size sweep;
# 2. with the sweep's best blocks exported (RLBENCH_MOE_DECODE_BLOCKS), the MoE GRPO step through
#    tools/sm90/moe_grpo_call.sh: the compiled configuration with transformers' MoE block in the decode step
#    (+hf_moe, the old path) and with the fused one, then TRL, each in a process of its own.
# Writes $OUT/micro.txt, $OUT/moe_decode_bench.json, and what moe_grpo_call.sh writes ($OUT/log.txt, results.tar.gz).
set -u
BUDGET=${1:-560}
END=$((SECONDS + BUDGET))
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -n "${MICRO:-1}" ] && [ "${MICRO:-1}" != 0 ]; then
  timeout 150 python3 tools/sm90/moe_decode_bench.py --out $OUT 2>&1 | grep -v "ExpertsInterface" | tee $OUT/micro.txt
  BEST=$(grep -o "^best_blocks=[0-9,]*" $OUT/micro.txt | cut -d= -f2)
  [ -n "$BEST" ] && export RLBENCH_MOE_DECODE_BLOCKS=$BEST
fi
echo "RLBENCH_MOE_DECODE_BLOCKS=${RLBENCH_MOE_DECODE_BLOCKS:-default}" | tee -a $OUT/micro.txt
MODES=${MODES:-bf16_params+compile+compile_decode+hf_moe,bf16_params+compile+compile_decode} LAYERS=${LAYERS:-4} \
  bash tools/sm90/moe_grpo_call.sh $((END - SECONDS))
