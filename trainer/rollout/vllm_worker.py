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

A second one, for mixtures of experts on the CPU backend: vLLM's CPU experts kernel
(`CPUUnquantizedExperts`) computes from expert weights prepacked into its grouped-GEMM layout,
and the prepack runs in `moe_kernel.fused_experts.process_weights_after_loading`, which the
unquantized MoE method calls on the first load only (`_setup_kernel`: "Setup moe kernel only on
the first call"). A reload therefore leaves the new weights unpacked and the kernel reads them
as packed: measured on tiny:qwen3_moe, resending the very weights the engine started with moved
its log-probs by 7.2 nats. `rlbench_load_weights` runs that prepack again on every MoE layer
whose experts were in the load (`_reloaded_moe_layers`), and on no other (a packed weight
packed twice is wrong too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _tied(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None
    return bool(getattr(text, "tie_word_embeddings", False))


def _lm_head(model: Any) -> Any:
    """The LM head: on the model (text models) or on its `language_model` (vLLM's Qwen2-VL family)."""
    head = getattr(model, "lm_head", None)
    return head if head is not None else getattr(getattr(model, "language_model", None), "lm_head", None)


def _cpu_moe_layers(model: Any) -> Iterator[tuple[str, Any, Any]]:
    """(module name, module, fused experts) of the MoE layers whose experts kernel prepacks its weights
    (vLLM's CPU experts: `process_weights_after_loading` overridden from the base no-op)."""
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEExperts

    base = getattr(FusedMoEExperts, "process_weights_after_loading", None)
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and getattr(type(experts), "process_weights_after_loading", None) is not base:
            yield name, module, experts


def _reloaded_moe_layers(names: list[str], model: Any) -> list[tuple[Any, Any]]:
    """(module, fused experts) of each prepacking MoE layer whose decoder layer's experts are among
    `names` (HF names: `...layers.<i>.mlp.experts...`, `...block_sparse_moe.experts...`)."""
    sent = {m.group(1) for n in names if ".experts." in n or n.endswith(".experts")
            for m in [_LAYER_INDEX.search(n)] if m}
    out = []
    for name, module, experts in _cpu_moe_layers(model):
        m = _LAYER_INDEX.search(name)
        if m and m.group(1) in sent:
            out.append((module, experts))
    return out


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
        if self.device.type != "cpu":  # type: ignore[attr-defined]
            return len(names)
        head = _lm_head(model)
        if _tied(model) and head is not None:
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(head, remove_weight=False)
        for module, experts in _reloaded_moe_layers(names, model):  # the CPU experts' prepack (module docstring)
            experts.process_weights_after_loading(module)
        return len(names)

    def rlbench_model_facts(self) -> dict[str, Any]:
        """What the worker runs: model class, device, dtype, tied embeddings, torch threads."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        p = next(model.parameters())
        return {"model_class": type(model).__name__, "device": str(self.device),  # type: ignore[attr-defined]
                "dtype": str(p.dtype).removeprefix("torch."), "tied_embeddings": _tied(model),
                "torch_threads": torch.get_num_threads()}
