#!/bin/bash
# One call on the lent nvidia-h200, from the repository root, wheels carried in .whl (pydantic and its two
# helpers, trl, datasets, dill, multiprocess):
#   COMMIT=$(git rev-parse HEAD) [MODES=bf16_params,...] [LAYERS="4 8"] bash tools/sm90/moe_grpo_call.sh [BUDGET_S]
# (MODES: this trainer's variants, as `--grpo-modes`; run 14 used the defaults, run 15 MODES=bf16_params,
# bf16_params+compile+compile_decode LAYERS=4)
# The MoE GRPO step (static-engine rollout, old log-probs, actor update, in-place weight sync) of this trainer
# and TRL's GRPOTrainer on the same model and batch (Qwen3-30B-A3B width, random weights; 8 prompts x 8
# samples, 128-token prompts, 256 sampled tokens each), each side and mode in a process of its own: 4 layers, then
# 8 layers while time is left. Writes $OUT/log.txt and every result JSON packed into $OUT/results.tar.gz.
set -u
BUDGET=${1:-540} MODES=${MODES:-bf16_params} LAYERS=${LAYERS:-4 8}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
END=$((SECONDS + BUDGET))
R=/tmp/res; mkdir -p $R
left() { local l=$((END - SECONDS)); echo $((l < $1 ? l : $1)); }
log() { grep --line-buffered -v -i "warn\|it/s\]\|^{'loss'" | tee -a $OUT/log.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  echo "commit ${COMMIT:-unknown}"
  python3 -c "import sys,torch,transformers,trl,datasets;print(sys.version.split()[0],'torch',torch.__version__,'transformers',transformers.__version__,'trl',trl.__version__,'datasets',datasets.__version__)"
} 2>&1 | log
side() {  # layers, name, limit, sections, flags
  local L=$1 name=$2 lim=$3 sections=$4; shift 4
  local l=$(left $lim)
  [ "$l" -lt 30 ] && { echo "=== SKIP $name L$L (no time) t=$SECONDS" | log; return; }
  echo "=== $name L$L (limit $l s) t=$SECONDS" | log
  timeout $l python3 -m trainer.bench ${sections//,/ } --grpo-shape qwen3-30b-a3b-l$L --grpo-modes $MODES --grpo-steps 4 \
    "$@" --out $R/${name}_l$L 2>&1 | log
  echo "=== rc ${PIPESTATUS[0]} t=$SECONDS" | log
}
for L in $LAYERS; do
  sections=ceilings,grpo  # the copy and matmul ceilings, in the first mode's process
  for M in ${MODES//,/ }; do  # each mode in a process of its own: compiled graphs keep the last one's memory
    MODES=$M side $L rlbench_${M//+/_} 200 $sections --no-trl
    sections=grpo
  done
  side $L trl 240 grpo --no-rlbench
done
tar czf $OUT/results.tar.gz -C $R .
