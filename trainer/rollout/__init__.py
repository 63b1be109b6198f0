"""Generation: the engine interface and its engines (HF, static-cache, vLLM, SGLang), and weight sync to them.

- `base.py`, `decode_cache.py`  the interface (`Rollout`, `SamplingParams`, `InterruptibleEngine`) and decode
                                caches; the low layer every other layer may import
- `hf.py`, `static.py`, `vllm_engine.py`, `vllm_worker.py`, `sglang_engine.py`  the engines
- `checkpoint_layout.py`, `multimodal_prompts.py`  what the vLLM/SGLang engines are given
- `weight_sync.py`  bucketed broadcast of the trainer's weights to engines on other devices
- `registry.py`     `rollout.engine` -> the engine

May import (engines): `trainer.errors`, `trainer.config`, `trainer.data`, `trainer.components`, `trainer.ops`,
`trainer.models` (not the warm starts), `trainer.backends.compile`. Not the step, the workers or the loops.
"""
