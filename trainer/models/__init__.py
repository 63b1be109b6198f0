"""The model families, their warm starts and the loader, in three layers (lowest first):

1. the families, no weights loaded:
   - `specs.py`  what a `model.path` names: embedded models, tiny and `shape:` configs, dtypes, the cache
                 folder, EOS ids
   - `moe.py`    the MoE family: tiny MoE configs, upcycling a dense model, MoE detection
   - `vlm.py`    the vision-language family: tiny VLMs, vision processors, the multimodal forward
   May import: `trainer.errors`, `trainer.config`, `trainer.data`, `trainer.components`,
   `trainer.rollout.base` / `decode_cache`.
2. the warm starts, a short supervised start before RL, cached by content:
   - `warm_start.py`     tool-format traces, any causal LM
   - `warm_start_vlm.py` the synthetic figures, the tiny VLM
   May also import `trainer.ops` and the rollout engines (they sample with `trainer.rollout.hf`).
3. the loader: `loading.py` (`load_model_and_tokenizer`: HF folders, GGUF, embedded, tiny and `shape:`
   models, warm starts applied) and `__main__.py` (`python -m trainer.models`: build a warm start).
   Imported by the step, the workers, preflight and bench; never by the layers below it.
"""
