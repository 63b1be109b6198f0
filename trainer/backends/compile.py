"""`actor.compile: true`: `torch.compile` of the training forward/backward with a fixed set of graphs.

What is compiled:
- every decoder layer, `torch.compile(layer, dynamic=False)` (inductor by default). Layers of one
  model share one Python code object and, with dynamo's inlining of built-in `nn.Module`s, one graph
  per input shape: the parameters are graph inputs, not constants, so 28 layers compile once.
- the LM-head chunk math (`trainer.ops.logprobs.compiled_chunk_fns`): log-sum-exp / target log-prob
  / entropy read from the bf16 logits, and the closed-form logit gradient in one fused pass.

Why the fixed shapes (and what made compiled runs vary): with `dynamic=False` every new input shape
is a new graph, and after `recompile_limit` (8 by default) graphs of one code object dynamo silently
runs the rest in eager. Measured on CPU with a 12-layer tiny Qwen2 (`TORCH_LOGS=recompiles`):
- the shared-prompt KV path passes a `DynamicCache` into each layer; its `update(..., layer_idx)`
  guards on the cache's length, so every layer is a new graph: 8 graphs, then
  "hit config.recompile_limit (8)" and layers 9-12 ran eager. Compiled mode therefore runs the
  full-sequence forward (the prompt is recomputed for each of the n responses of a group);
- micro-batch widths follow the longest response of each batch: the decoder input is right-padded
  to a multiple of `SEQ_MULTIPLE` tokens and the last LM-head chunk to a multiple of `ROW_MULTIPLE`
  rows, bounding the graphs to (width buckets x micro-batch row counts);
- `recompile_limit` is raised to `RECOMPILE_LIMIT` so that these buckets never fall back to eager.

Inductor's compile worker pool is turned off (`compile_threads = 1`, unless TORCHINDUCTOR_COMPILE_THREADS
is set): on an H200 (torch 2.11), while the pool's worker processes were alive the compiled 1.5B training step
took 0.43-0.44 s instead of 0.33 s in 5 of 7 processes (every process that loaded its graphs from inductor's
cache, and cold ones after a few steps), with the same 307 ms of kernel time per step, so the extra time was
host-side gaps; with the pool off, warm and cold processes both ran 0.329-0.331 s per step and a cold compile
took no longer (reports/sm90/README.md, run 5).

Cost: the first step of each new shape compiles (about 9 s cold, under 2 s from inductor's cache
for the 1.5B shape on an H200); CPU-side guard checks on every layer call. Single worker only (not with
FSDP2-sharded models), and not with gradient checkpointing.
"""

from __future__ import annotations

import os

import torch

RECOMPILE_LIMIT = 64


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder block list of a HF causal LM (`model.model.layers` for Qwen2/Llama)."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no `{model.base_model_prefix}.layers` ModuleList to compile")
    return layers


def raise_recompile_limit(limit: int = RECOMPILE_LIMIT) -> None:
    """Let dynamo keep up to `limit` graphs per code object before falling back to eager."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the newer name, then the older one
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), limit))
            break
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(int(cfg.accumulated_recompile_limit), 4 * limit)


def compile_in_process() -> None:
    """Compile without inductor's worker pool (see the module docstring), unless the environment chose."""
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        import torch._inductor.config as inductor_config
        inductor_config.compile_threads = 1


def compile_decoder_layers(model: torch.nn.Module, backend: str = "inductor") -> int:
    """`torch.compile(dynamic=False)` every decoder layer in place; returns how many were wrapped."""
    raise_recompile_limit()
    compile_in_process()
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(backend=backend, dynamic=False)
    return len(layers)
