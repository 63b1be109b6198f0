"""MoE on the Megatron backend: megatron-core's load-balancing loss at the trainer's scale, and the
router statistics of docs/metrics.md from megatron's routers.

    recorder = MegatronRouterRecorder(gpt)          # hooks every TopKRouter of the GPTModel
    with recorder.capture():
        set_aux_loss_scale(micro_tokens / mini_batch_tokens, device)
        gpt(ids, pos, causal, padding_mask=padding)  # [N, T], True after each row's real tokens
    loss, stats, counts = recorder.pop()            # the FSDP2 path's reduction (trainer/models/moe.py)

The actor (`MegatronActor._logprobs`, `trainer/backends/megatron/backend.py`) does this for every update
micro-batch; `python3 -m pytest tests/unit/test_megatron_moe.py` compares it with the FSDP2 path.

Load-balancing loss (`actor.moe_aux_loss_coeff`): megatron-core's own. `build_bridge` sets the
TransformerConfig's `moe_router_load_balancing_type="aux_loss"` and `moe_aux_loss_coeff`; each
TopKRouter then computes the switch loss `coeff * E / (k T^2) * sum_e P_e f_e` on its micro-batch
(`switch_load_balancing_loss_func`; with the padding mask the actor passes, P_e and f_e sum over
real tokens only and T counts them) and attaches it to the graph with `MoEAuxLossAutoScaler`, whose
backward gives the loss the gradient `MoEAuxLossAutoScaler.main_loss_backward_scale`. Megatron's
schedules set that scale to `1 / num_micro_batches` to match their per-micro-batch mean loss;
this trainer's loss is a token mean over the whole mini-batch (every micro-batch's loss divided by
the mini-batch's response tokens, summed over data-parallel ranks), so the actor sets it per
micro-batch to `response tokens of the micro-batch / response tokens of the mini-batch`, the
weight the FSDP2 path multiplies its own copy of the same loss by (`trainer/backends/actor.py`).
The two backends then take the same update for the same coefficient
(`tests/unit/test_megatron_moe.py`). `calculate_per_token_loss` stays off (it would multiply the
aux loss by the micro-batch's token count).

Statistics (`actor/moe/*`): a forward hook on every TopKRouter takes its input and padding mask,
recomputes the router logits with the router's own `gating` (one `[T, H] x [H, E]` GEMM, no
gradient), and records them with the mask of real tokens; `RouterRecorder.pop` (the FSDP2 path's)
turns them into the load-balancing loss value, router entropy and per-expert top-k counts, and the
update loop sums the counts over the data-parallel ranks. Under expert parallelism the router runs
before dispatch on the rank's own tokens, so the summed counts are those of the whole mini-batch.
Under sequence parallelism a router sees its TP rank's slice of the sequence; the hook gathers the
slices first, so every TP rank records the whole micro-batch, as without it.
Megatron's aux-loss tracker (`load_balancing_loss`, the same value) is cleared after each
micro-batch so it does not grow across updates.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.models.moe import RouterRecorder


def megatron_routers(gpt: torch.nn.Module) -> list[torch.nn.Module]:
    """The GPTModel's TopKRouter modules, in layer order."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in gpt.modules() if isinstance(m, TopKRouter)]


class MegatronRouterRecorder(RouterRecorder):
    """`RouterRecorder` over a megatron-core GPTModel's routers (module docstring); `pop()`, `capture()`
    and `remove()` are the FSDP2 recorder's."""

    def __init__(self, gpt: torch.nn.Module):  # noqa: super().__init__ hooks transformers' routers
        self.routers = megatron_routers(gpt)
        if not self.routers:
            raise ValueError(f"{type(gpt).__name__} has no megatron TopKRouter modules to record")
        self.num_experts = int(self.routers[0].config.num_moe_experts)
        self.top_k = int(self.routers[0].topk)
        self.num_layers = len(self.routers)
        self._layer = {id(m): i for i, m in enumerate(self.routers)}
        self._events: list[tuple[int, torch.Tensor]] = []
        self._on = False
        self._handles = [r.register_forward_hook(self._router_hook) for r in self.routers]
        reset_megatron_tracker()  # sized by the first model that records; this one may have other layer counts

    def _router_hook(self, module: torch.nn.Module, args: tuple, _out: Any) -> None:
        if not self._on:
            return
        hidden = args[0]  # [S, B, H]; sequence parallel: this TP rank's [S / TP, B, H]
        pad = args[1] if len(args) > 1 else None  # [S, B], True: padding
        if module.config.sequence_parallel:  # statistics of the whole sequence on every TP rank
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region as gather

            with torch.no_grad():
                hidden = gather(hidden, tensor_parallel_output_grad=False)
                pad = None if pad is None else gather(pad.to(torch.uint8), tensor_parallel_output_grad=False)
        with torch.no_grad():
            logits = module.gating(hidden).reshape(-1, self.num_experts)
        valid = torch.ones(logits.shape[0], device=logits.device) if pad is None else (~pad.bool()).reshape(-1)
        self._events.append((-1, valid))
        self._events.append((self._layer[id(module)], logits))

    def pop(self) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        """The FSDP2 recorder's reduction; the loss it returns carries no gradient (megatron attached its
        own to the graph), and megatron's aux-loss tracker is cleared."""
        clear_megatron_tracker()
        return super().pop()


def clear_megatron_tracker() -> None:
    """Zero megatron-core's MoE metrics tracker (0.16: `clear_aux_losses_tracker`; 0.19: the tracker object)."""
    from megatron.core.transformer.moe import moe_utils

    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    except ImportError:
        moe_utils.clear_aux_losses_tracker()
        return
    get_moe_metrics_tracker().clear()


def reset_megatron_tracker() -> None:
    """Drop megatron-core's MoE metrics tracker entries, whose per-layer tensors the first recording sizes to its
    model's layer count (`clear_megatron_tracker` only zeroes them); a later model with more layers would index
    past them (0.16: the `_MOE_LAYER_WISE_LOGGING_TRACKER` dict; 0.19: the tracker object)."""
    from megatron.core.transformer.moe import moe_utils

    try:
        from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker
    except ImportError:
        moe_utils.get_moe_layer_wise_logging_tracker().clear()
        return
    destroy_moe_metrics_tracker()


def set_aux_loss_scale(weight: float, device: torch.device) -> None:
    """The gradient megatron's `MoEAuxLossAutoScaler` gives the routers' load-balancing losses in the next
    backward: this micro-batch's share of the mini-batch's response tokens (module docstring)."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    # shape [1], as megatron's schedules set it: the first call's tensor is kept and later ones are copied into it
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor([float(weight)], device=device))

