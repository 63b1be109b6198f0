"""The model families and their warm starts: load a policy (dense, MoE, vision-language) and its tokenizer.

- `loading.py`        `load_model_and_tokenizer`: HF folders, embedded GGUF, tiny and `shape:` models
- `moe.py`            the MoE family: tiny MoE configs, upcycling a dense model, MoE detection
- `vlm.py`            the vision-language family: tiny VLMs, vision processors, multimodal forward
- `warm_start.py`     a short supervised start (tool-format traces) before RL, cached by content
- `warm_start_vlm.py` the same for a vision-language model on the synthetic figures

May import: `trainer.errors`, `trainer.config`, `trainer.data`, `trainer.components`, `trainer.ops`,
`trainer.rollout.base` / `decode_cache`. The warm starts stand above the rollout engines (they
generate with `trainer.rollout.hf`), so the loaders never import them; the caller applies them.
"""
