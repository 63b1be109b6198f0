"""GPU machine, call 2 of 3: assemble SmolLM2-135M-Instruct's GGUF from its two carried parts and
convert it once into the trainer's model cache ($RLBENCH_CACHE/models/smollm2-135m-instruct), so
every Ray worker of call 3 loads `embedded:smollm2-135m-instruct` in a second or two.

    python3 tools/sm90/async_gpu_prepare.py /tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/rlcache
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(gguf: str, cache: str) -> None:
    t0 = time.time()
    path = Path(gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.hf_quantizer = None  # de-quantized on load: save a plain checkpoint (as trainer/models/loading.py does)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    out = Path(cache) / "models" / "smollm2-135m-instruct"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(json.dumps({"converted_to": str(out), "seconds": round(time.time() - t0, 1), "torch": torch.__version__,
                      "transformers": transformers.__version__, "cuda": torch.version.cuda,
                      "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
