"""NOT SGLang: the rehearsal's stand-in for `sglang.Engine`, on the tests' engine double, driven by a tiny model.

SGLang has no CPU build (docs/hardware.md), so a rehearsal of an SGLang profile runs the project's SGLang
adapter (`trainer/rollout/sglang_engine.py`, unchanged) against this package, which a rehearsal puts first
on PYTHONPATH (`rlbench/rehearse/run.py`); every rehearsal report of such a run says
"SGLang: adapter against a double, not a real SGLang run".

`Engine` is the tests' `FakeSGLangEngine` (`tests/helpers/engines.py`: SGLang 0.5.23's generate / stream /
abort / weight / memory calls, recorded) with its `script` answered by a transformers model loaded from the
HF folder the adapter passes as `model_path` (the trainer's weights saved by `model_dir_for_engine`), so the
log-probs it returns are the engine-side half of the rollout-vs-trainer agreement:

- generate: each request sampled on its own with its `sampling_seed`, `log_softmax(logits / T)` of the sampled
  token before the top-k / top-p filters (SGLang 0.5.23's definition; greedy: `log_softmax(logits)`), stopped
  at `stop_token_ids` (kept, `no_stop_trim`) or `max_new_tokens`;
- update_weights_from_tensor: every tensor must name a tensor of the checkpoint the engine loaded, with its
  shape (else `(False, message)`, as SGLang answers); on the last bucket (`flush_cache=True`) the merged
  checkpoint is loaded again through `from_pretrained`, which maps the checkpoint layout (per-expert MoE
  tensors) onto transformers' modules as SGLang's loader maps it onto its own;
- what the double does not have: SGLang's tensor parallelism (`tp_size` is accepted and has no effect: the
  rehearsal runs the adapter with TP=1 and says so), its scheduler, kernels, memory saver and images
  (image requests raise).

Importing this module also lifts the adapter's GPU check (`require_cuda`): the double runs on the CPU.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.helpers.engines import FakeSGLangEngine

__version__ = "0.5.23"
IS_REHEARSAL_DOUBLE = True
MARKER = "[sglang double]"  # on stderr: the rehearsal counts these lines as evidence the double ran


def _lift_gpu_check() -> None:
    import trainer.rollout.sglang_engine as adapter

    adapter.require_cuda = lambda engine, device: None


_lift_gpu_check()


def _load(folder: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    cfg = json.loads((Path(folder) / "config.json").read_text())
    if "model_type" not in cfg:
        raise RuntimeError(f"sglang double: {folder}/config.json has no model_type: {sorted(cfg)[:8]} "
                           f"{sorted(p.name for p in Path(folder).iterdir())}")
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, output_loading_info=True)
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
    if missing:
        raise RuntimeError(f"sglang double: the checkpoint lacks {missing[:3]}")
    return model.eval()


class Engine(FakeSGLangEngine):
    def __init__(self, model_path: str, dtype: str = "float32", tp_size: int = 1, **kwargs: Any):
        super().__init__(script=self._sample)
        self.model_path, self.tp_size, self.kwargs = model_path, tp_size, kwargs
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)
        from safetensors.torch import load_file

        files = sorted(Path(model_path).glob("*.safetensors"))
        self.checkpoint = {k: v for f in files for k, v in load_file(str(f)).items()}
        self.model = _load(model_path, self.dtype)
        self._pending: dict[str, torch.Tensor] = {}
        self._folder = Path(tempfile.mkdtemp(prefix="rlbench-sglang-double-"))
        for f in Path(model_path).iterdir():
            if f.suffix == ".json" and f.name != "model.safetensors.index.json":
                (self._folder / f.name).write_bytes(f.read_bytes())
        print(f"{MARKER} Engine(model_path={model_path}, tp_size={tp_size}) pid {os.getpid()}", file=sys.stderr, flush=True)

    # ---- generate: the tests' double streams / aborts; each request's whole response comes from here
    def generate(self, input_ids: list[list[int]], sampling_params: list[dict], return_logprob: bool = False,
                 rid: list[str] | None = None, stream: bool = False, **kwargs: Any) -> Any:
        if kwargs.get("image_data") is not None:
            raise NotImplementedError("sglang double: image requests are not served (no vision path)")
        if kwargs:
            raise TypeError(f"sglang double: unexpected generate arguments {sorted(kwargs)}")
        return super().generate(input_ids, sampling_params, return_logprob, rid, stream)

    @torch.no_grad()
    def _sample(self, row: list[int], sp: dict[str, Any]) -> tuple[list[int], list[float], str]:
        from trainer.rollout.base import SamplingParams
        from trainer.rollout.hf import sample_next

        greedy = float(sp.get("temperature", 1.0)) == 0.0
        params = SamplingParams(temperature=1.0 if greedy else float(sp["temperature"]), top_p=float(sp.get("top_p", 1.0)),
                                top_k=int(sp.get("top_k", -1)), greedy=greedy)
        gen = torch.Generator().manual_seed(int(sp.get("sampling_seed", 0)))
        stops = set(sp.get("stop_token_ids") or [])
        ids = torch.tensor([row], dtype=torch.long)
        toks: list[int] = []
        lps: list[float] = []
        reason = "length"
        for _ in range(int(sp["max_new_tokens"])):
            logits = self.model(input_ids=ids).logits[:, -1, :]
            tok, lp = sample_next(logits, params, gen)
            toks.append(int(tok[0]))
            lps.append(float(lp[0]))
            ids = torch.cat([ids, tok.view(1, 1)], dim=1)
            if toks[-1] in stops:
                reason = "stop"
                break
        return toks, lps, reason

    # ---- weights
    def update_weights_from_tensor(self, named_tensors: list, load_format: str | None = None,
                                   flush_cache: bool = True) -> Any:
        super().update_weights_from_tensor(named_tensors, load_format, flush_cache)
        for name, t in named_tensors:
            have = self.checkpoint.get(name)
            if have is None:
                return False, f"sglang double: no weight named {name} in the checkpoint"
            if tuple(have.shape) != tuple(t.shape):
                return False, f"sglang double: {name} shape {tuple(t.shape)} != {tuple(have.shape)}"
            self._pending[name] = t.detach().to("cpu").clone()
        if flush_cache:
            from safetensors.torch import save_file

            self.checkpoint.update(self._pending)
            self._pending = {}
            save_file({k: v.contiguous() for k, v in self.checkpoint.items()}, str(self._folder / "model.safetensors"))
            self.model = _load(str(self._folder), self.dtype)
            print(f"{MARKER} weights reloaded ({len(self.checkpoint)} tensors)", file=sys.stderr, flush=True)
        return True, "ok"

    def shutdown(self) -> None:
        pass


def describe() -> str:
    return json.dumps({"double": "sglang", "version": __version__, "pid": os.getpid()})
