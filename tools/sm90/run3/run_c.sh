#!/usr/bin/env bash
# Training MFU, run 3, third call: mixed-dtype foreach-copy probe on a real parameter list, and the
# torch.compile variant with the matmul ceiling measured in the same process (plus its kernel profile).
set -uo pipefail
W=/tmp/run3c; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/pydantic*.whl .whl/annotated_types*.whl .whl/typing_inspection*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 - <<'PY'
import torch
from trainer.bench.perf import shape_model
m = shape_model("qwen2.5-0.5b", "float32", torch.device("cuda"))
src = [p.detach().clone() for p in m.parameters()]
for scale in (1.0, 1.5):
    torch._foreach_mul_(src, scale)
    dst = [s.to(torch.bfloat16).zero_() for s in src]
    torch._foreach_copy_(dst, src)
    bad = [i for i, (d, s) in enumerate(zip(dst, src)) if not torch.equal(d, s.to(torch.bfloat16))]
    print(f"probe foreach_copy fp32->bf16, {len(src)} tensors, scale {scale}: {len(bad)} unequal, "
          f"nonfinite {sum(int((~torch.isfinite(d)).sum()) for d in dst)}, first bad {bad[:5]}")
PY
timeout 120 python3 -m trainer.bench ceilings train --train-shapes qwen2.5-1.5b --train-seqs 16 --train-len 1024 \
  --train-micro 16 --steps 6 --train-modes bf16_params+compile --train-chunks 4096 --profile --out $W > $W/bench.log 2>&1
grep -v "^ *[0-9.]* ms" $W/bench.log | tail -4; grep "^ *[0-9.]* ms" $W/bench.log | head -12
cp $W/bench.log $OUT/compile_bench.log; tar czf $OUT/run3c_json.tgz -C $W .
