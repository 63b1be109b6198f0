"""megatron-core's alltoall MoE token dispatcher, the Megatron backend's on every device (`build_bridge`),
on CPU under gloo (through `cpu_shim`), checked against an MoE computed by hand.

    python3 -m pytest -q tests/unit/test_megatron_dispatcher.py

Two gloo processes at EP=2, one MoE layer of a tiny Qwen3-MoE GPTModel built as the backend builds it
(4 experts, top-2, 2 experts per rank, `GroupedExperts`), each rank its own tokens:
- layout: the experts module receives the tokens grouped by local expert, each group the tokens routed
  to that expert from rank 0, then from rank 1, in token order, with their routing probabilities, and
  `tokens_per_expert` holds the group sizes (what `GroupedExperts` splits by);
- the layer's output and its gradients (input, router, experts) equal a dense reference (every expert on
  every token, weighted by the router's top-k probabilities; expert gradients summed over the ranks);
- the same checks fail by far on a dispatcher whose chunk sort is off (the experts get their tokens grouped
  by source rank) or whose chunk restore is off (expert outputs go back to the wrong rank and row).
EP=2 against EP=1 for the whole model (log-probs, metrics, updated weights; the `actor/moe/*` metrics):
tests/unit/test_megatron_backend.py::test_two_ranks_match_one, tests/unit/test_megatron_moe.py.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.helpers.ranks import leave_group, spawn_ranks
from trainer.backends.strategy import megatron_missing

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")
OFF = {"moe_permute_fusion": False, "moe_pad_expert_input_to_capacity": False, "moe_expert_capacity_factor": None,
       "moe_router_padding_for_quantization": False, "moe_grouped_gemm": False}
TOL = 1e-5  # fp32, relative to the reference's largest entry


def _moe_layer(ep: int):
    from trainer.backends.megatron.backend import build_bridge, build_gpt_model, init_parallel
    from trainer.models.specs import tiny_config

    init_parallel(1, ep, seed=0)
    bridge = build_bridge(tiny_config("qwen3_moe", vocab_size=128), dtype=torch.float32)
    torch.manual_seed(0)
    return bridge.config, build_gpt_model(bridge).decoder.layers[0].mlp


def test_alltoall_dispatcher_with_the_fusions_off():
    config, moe = _moe_layer(1)
    assert type(moe.token_dispatcher).__name__ == "MoEAlltoAllTokenDispatcher"
    assert type(moe.experts).__name__ == "GroupedExperts"
    assert config.moe_token_dispatcher_type == "alltoall"
    assert {k: getattr(config, k) for k in OFF} == OFF


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def _expert(x: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, fc1).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, fc2)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max()) if a.shape == b.shape else float("inf")


def _measure(moe, mode: str) -> dict:
    """One forward + backward of the MoE layer and of the dense reference on this rank's tokens (module
    docstring); `mode`: clean, sort_off or restore_off (the dispatcher's chunk permutation broken)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    d, experts, router = moe.token_dispatcher, moe.experts, moe.router
    saved = d.sort_input_by_local_experts, d.restore_output_by_local_experts
    n = saved[0].numel()
    if mode == "sort_off":
        d.sort_input_by_local_experts = torch.arange(n)
    if mode == "restore_off":
        d.restore_output_by_local_experts = torch.arange(n)
    g = torch.Generator().manual_seed(10 + rank)  # other tokens on each rank: unequal all-to-all splits
    x = torch.randn(8, 3, moe.config.hidden_size, generator=g, requires_grad=True)  # [S, B, H]
    seen: dict = {}
    hooks = [router.register_forward_hook(lambda m, a, o: seen.update(probs=o[0].detach(), routing=o[1])),
             experts.register_forward_hook(lambda m, a, o: seen.update(tokens=a[0].detach(), tpe=a[1],
                                                                       eprobs=a[2].detach()))]
    out = moe(x)[0]
    for h in hooks:
        h.remove()
    w = torch.randn(out.shape, generator=g)
    params = (router.weight, experts.fc1, experts.fc2)
    for p in params:
        p.grad = None
    (out * w).sum().backward()
    got_grads = [x.grad] + [p.grad.clone() for p in params]
    d.sort_input_by_local_experts, d.restore_output_by_local_experts = saved
    splits = (d.input_splits.tolist(), d.output_splits.tolist())

    # layout: the tokens of every rank routed to each local expert, source rank by source rank, in token order
    xs, maps, probs = _gather(x.detach().reshape(-1, x.shape[-1])), _gather(seen["routing"]), _gather(seen["probs"])
    local = experts.num_local_experts
    mine = range(rank * local, (rank + 1) * local)  # this rank's experts
    want_tokens = torch.cat([xs[s][maps[s][:, e]] for e in mine for s in range(world)])
    want_probs = torch.cat([probs[s][maps[s][:, e], e] for e in mine for s in range(world)])
    want_tpe = [sum(int(maps[s][:, e].sum()) for s in range(world)) for e in mine]

    # dense reference: all experts (gathered over the ranks) on every token, top-k probabilities as weights
    for p in params:
        p.grad = None
    x2 = x.detach().clone().requires_grad_()
    fc1 = torch.cat(_gather(experts.fc1.detach())).requires_grad_()
    fc2 = torch.cat(_gather(experts.fc2.detach())).requires_grad_()
    p2, map2 = router(x2)
    flat = x2.reshape(-1, x2.shape[-1])
    ref = sum((p2[:, e] * map2[:, e]).unsqueeze(-1) * _expert(flat, fc1[e], fc2[e])
              for e in range(fc1.shape[0])).reshape(out.shape)
    (ref * w).sum().backward()
    for full in (fc1.grad, fc2.grad):  # each expert's gradient: the tokens of every rank
        dist.all_reduce(full)
    want_grads = [x2.grad, router.weight.grad, fc1.grad[mine.start:mine.stop], fc2.grad[mine.start:mine.stop]]
    for p in params:
        p.grad = None
    return {"layout": _rel(seen["tokens"], want_tokens), "probs": _rel(seen["eprobs"], want_probs),
            "tokens_per_expert": [int(c) for c in seen["tpe"]], "want_tokens_per_expert": want_tpe,
            "output": _rel(out.detach(), ref.detach()), "splits": splits,
            "grads": {k: _rel(a, b) for k, a, b in zip(("input", "router", "fc1", "fc2"), got_grads, want_grads)}}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _, moe = _moe_layer(world)
    res = {"dispatcher": type(moe.token_dispatcher).__name__,
           **{mode: _measure(moe, mode) for mode in ("clean", "sort_off", "restore_off")}}
    everyone = [None] * world
    dist.all_gather_object(everyone, res)
    if rank == 0:
        torch.save(everyone, out)
    leave_group()


@pytest.mark.integration
def test_alltoall_dispatcher_at_ep2_matches_the_dense_moe():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.pt")
        spawn_ranks(_worker, 2, out)
        ranks = torch.load(out)
    for r, res in enumerate(ranks):
        assert res["dispatcher"] == "MoEAlltoAllTokenDispatcher"
        clean = res["clean"]
        send, recv = clean["splits"]
        assert min(send) > 0 and send[0] != send[1], (r, send)  # tokens go both ways, in unequal numbers
        assert sum(recv) == sum(clean["tokens_per_expert"]), (r, recv)
        assert clean["tokens_per_expert"] == clean["want_tokens_per_expert"], (r, clean)
        assert clean["layout"] == 0.0 and clean["probs"] == 0.0, (r, clean)  # copies: exact
        assert clean["output"] < TOL and max(clean["grads"].values()) < TOL, (r, clean)
        # the broken permutations: sort off scrambles what the experts see; restore off, where outputs go
        assert res["sort_off"]["layout"] > 0.1 and res["sort_off"]["output"] > 0.1, (r, res["sort_off"])
        assert res["restore_off"]["layout"] == 0.0 and res["restore_off"]["output"] > 0.1, (r, res["restore_off"])
