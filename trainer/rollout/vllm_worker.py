"""Code that runs inside vLLM's worker process: the weight-load extension of the `vllm` rollout engine.

vLLM mixes `RLBenchWorkerExtension` into its worker class (`LLM(worker_extension_cls=
"trainer.rollout.vllm_worker.RLBenchWorkerExtension")`), so the trainer process calls its methods
by name through `llm.collective_rpc("rlbench_load_weights", args=(names, tensors))`, in-process
or across vLLM's engine-core process boundary alike. Names and tensors travel as two lists:
vLLM's msgpack encoder carries tensors but turns tuples into lists, and vLLM's loaders need
`(name, tensor)` tuples, which are rebuilt here.

The load is vLLM's layerwise reload (`model_runner.reload_weights`): it restores the parameters
the kernels repacked, loads the checkpoint-format tensors through the model's own `load_weights`
(which fuses q/k/v and gate/up) and re-runs `process_weights_after_loading`, so kernels that keep
a packed copy (the CPU backend's oneDNN linear layers) are rebuilt. A direct
`model.load_weights(...)` does not do that and fails on CPU.

One exception, on the CPU backend only: with tied embeddings the LM head shares its weight with
the embedding, and the reload re-processes only one of the two parents (vLLM's
`model_loader/reload` documents this), so the LM head's packed GEMM handle keeps the old
weights. `rlbench_load_weights` re-dispatches it after every load (the head is
`model.language_model.lm_head` in vLLM's Qwen2-VL / Qwen2.5-VL). A partial load (a frozen
vision tower left out) is vLLM's too: layers that get no tensors keep their kernel tensors.
"""

from __future__ import annotations

from typing import Any

import torch


def _tied(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None
    return bool(getattr(text, "tie_word_embeddings", False))


def _lm_head(model: Any) -> Any:
    """The LM head: on the model (text models) or on its `language_model` (vLLM's Qwen2-VL family)."""
    head = getattr(model, "lm_head", None)
    return head if head is not None else getattr(getattr(model, "language_model", None), "lm_head", None)


def encode_tensor(t: torch.Tensor) -> list[Any]:
    """`[dtype name, shape, raw bytes]` of a tensor: plain msgpack types (a copy on the host)."""
    t = t.detach().contiguous().cpu()
    return [str(t.dtype).removeprefix("torch."), list(t.shape), t.view(-1).view(torch.uint8).numpy().tobytes()]


def decode_tensor(payload: Any) -> torch.Tensor:
    """The tensor `encode_tensor` described (a tensor passes through unchanged)."""
    if isinstance(payload, torch.Tensor):
        return payload
    dtype, shape, raw = payload
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype))
    return flat.view(list(shape))


class RLBenchWorkerExtension:
    """Methods added to vLLM's worker (`self` is the worker: `self.model_runner`, `self.device`)."""

    def rlbench_load_weights(self, names: list[str], payloads: list[Any]) -> int:
        """Reload the named checkpoint-format tensors into the running model; returns how many.

        Each payload is a tensor (in-process engine) or `[dtype, shape, bytes]` (`encode_tensor`;
        across vLLM's process boundary, where its encoder would leave a tensor undecodable)."""
        if len(names) != len(payloads):
            raise ValueError(f"rlbench_load_weights: {len(names)} names for {len(payloads)} tensors")
        pairs = [(name, decode_tensor(p)) for name, p in zip(names, payloads)]
        self.model_runner.reload_weights(weights_iterator=iter(pairs),  # type: ignore[attr-defined]
                                         is_checkpoint_format=True)
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = _lm_head(model)
        if self.device.type == "cpu" and _tied(model) and head is not None:  # type: ignore[attr-defined]
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(head, remove_weight=False)
        return len(names)

    def rlbench_model_facts(self) -> dict[str, Any]:
        """What the worker runs: model class, device, dtype, tied embeddings, torch threads."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        p = next(model.parameters())
        return {"model_class": type(model).__name__, "device": str(self.device),  # type: ignore[attr-defined]
                "dtype": str(p.dtype).removeprefix("torch."), "tied_embeddings": _tied(model),
                "torch_threads": torch.get_num_threads()}
