"""Tensor math shared by the backends and engines: log-probs from the LM head, FLOP counts.

May import: `trainer.errors`, `trainer.components.batch`, `trainer.rollout.base` / `decode_cache`. Never a model
family: what a model-specific forward needs is passed in by the caller.
"""
