"""The Megatron backend's local MoE token dispatcher (`trainer/backends/megatron/dispatch.py`) against
megatron-core's alltoall dispatcher and a dense MoE computed by hand, on CPU.

    python3 -m pytest -q tests/unit/test_megatron_local_dispatch.py

One MoE layer of a tiny Qwen3-MoE GPTModel built as the backend builds it (4 experts, top-k, `GroupedExperts`),
at EP=1, in fp32:
- the experts receive exactly the tokens, order, probabilities and counts megatron's dispatcher gives them;
- the layer's output and its gradients (input, router, experts) are bitwise megatron's at top-2 (one
  rounding of y1 + y2 either way) and within fp32 rounding at top-3, and equal the dense reference;
- a planted fault (one token's slots swapped with its neighbour's in the slot map) is caught by far;
- `actor.megatron.token_dispatcher`: auto resolves to local at EP=1 and alltoall above; local at EP>1 is a
  config error naming the field; the actor built with the defaults dispatches locally; a dispatcher that
  would drop tokens is refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.backends.strategy import megatron_missing

pytestmark = pytest.mark.skipif(megatron_missing() is not None,
                                reason="needs megatron-core and mbridge (pip install 'rlbench[megatron]')")


def _moe_layer(token_dispatcher: str, topk: int = 2):
    from trainer.backends.megatron.backend import build_bridge, build_gpt_model, init_parallel
    from trainer.models.specs import tiny_config

    init_parallel(1, 1, seed=0)
    cfg = tiny_config("qwen3_moe", vocab_size=128, overrides={"num_experts_per_tok": topk})
    bridge = build_bridge(cfg, dtype=torch.float32, token_dispatcher=token_dispatcher)
    torch.manual_seed(0)
    return build_gpt_model(bridge).decoder.layers[0].mlp


def _run(moe, seed: int = 3) -> dict:
    """One forward + backward on fixed tokens: the output, the gradients, what the experts received."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 3, moe.config.hidden_size, generator=g, requires_grad=True)  # [S, B, H]
    seen: dict = {}
    hook = moe.experts.register_forward_hook(lambda m, a, o: seen.update(
        tokens=a[0].detach().clone(), tpe=a[1].detach().clone(), probs=a[2].detach().clone()))
    out = moe(x)[0]
    hook.remove()
    params = (moe.router.weight, moe.experts.fc1, moe.experts.fc2)
    for p in params:
        p.grad = None
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return {"out": out.detach(), "grads": [x.grad] + [p.grad.clone() for p in params], **seen, "x": x.detach()}


def _dense(moe, x: torch.Tensor, seed: int = 3) -> dict:
    """Every expert on every token, weighted by the router's top-k probabilities."""
    g = torch.Generator().manual_seed(seed)
    torch.randn(x.shape, generator=g)  # the same weights for the output as `_run` draws
    x2 = x.clone().requires_grad_()
    fc1 = moe.experts.fc1.detach().clone().requires_grad_()
    fc2 = moe.experts.fc2.detach().clone().requires_grad_()
    probs, routing = moe.router(x2)
    flat = x2.reshape(-1, x2.shape[-1])
    out = 0
    for e in range(fc1.shape[0]):
        gate, up = F.linear(flat, fc1[e]).chunk(2, dim=-1)
        out = out + (probs[:, e] * routing[:, e]).unsqueeze(-1) * F.linear(F.silu(gate) * up, fc2[e])
    out = out.reshape(x.shape)
    moe.router.weight.grad = None
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return {"out": out.detach(), "grads": [x2.grad, moe.router.weight.grad.clone(), fc1.grad, fc2.grad]}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("topk", [2, 3])
def test_local_dispatch_matches_megatron_alltoall_and_the_dense_moe(topk):
    from trainer.backends.megatron.dispatch import LocalTokenDispatcher

    mega, local = _moe_layer("alltoall", topk), _moe_layer("local", topk)
    assert type(mega.token_dispatcher).__name__ == "MoEAlltoAllTokenDispatcher"
    assert isinstance(local.token_dispatcher, LocalTokenDispatcher)
    local.load_state_dict(mega.state_dict())
    want, got = _run(mega), _run(local)
    # what the experts see: the same tokens in the same order, the same probabilities and counts
    assert torch.equal(got["tokens"], want["tokens"]) and torch.equal(got["probs"], want["probs"])
    assert got["tpe"].tolist() == want["tpe"].tolist() and sum(got["tpe"].tolist()) == 48 * topk
    if topk == 2:  # one rounding of y1 + y2 on both sides
        assert torch.equal(got["out"], want["out"])
        assert all(torch.equal(a, b) for a, b in zip(got["grads"], want["grads"]))
    else:
        assert _rel(got["out"], want["out"]) < 1e-6
        assert max(_rel(a, b) for a, b in zip(got["grads"], want["grads"])) < 1e-6
    dense = _dense(local, got["x"])
    assert _rel(got["out"], dense["out"]) < 1e-5
    assert max(_rel(a, b) for a, b in zip(got["grads"], dense["grads"])) < 1e-5


def test_a_wrong_slot_map_is_caught(monkeypatch):
    """Token 0's slots swapped with token 1's in the combine's slot map (tokens 0 and 1 get each other's
    expert outputs), or in the map the permutation's backward sums by (each gets the other's input
    gradient): the comparison above sees each by far."""
    from trainer.backends.megatron import dispatch

    mega = _moe_layer("alltoall")
    want = _run(mega)

    def swap(slot_of_token):
        return slot_of_token[torch.tensor([1, 0, *range(2, slot_of_token.shape[0])])]

    combine, permute = dispatch._Combine.apply, dispatch._Permute.apply
    for fault in ("combine", "permute backward"):
        with monkeypatch.context() as m:
            if fault == "combine":
                m.setattr(dispatch._Combine, "apply", staticmethod(lambda y, tos, sot: combine(y, tos, swap(sot))))
            else:
                m.setattr(dispatch._Permute, "apply", staticmethod(lambda x, tos, sot: permute(x, tos, swap(sot))))
            local = _moe_layer("local")
            local.load_state_dict(mega.state_dict())
            got = _run(local)
        assert torch.equal(got["tokens"], want["tokens"])  # what the experts see is untouched
        out, grad_in = _rel(got["out"], want["out"]), _rel(got["grads"][0], want["grads"][0])
        if fault == "combine":
            assert out > 0.1, out
        else:
            assert out == 0.0 and grad_in > 0.1, (out, grad_in)


def test_token_dispatcher_setting():
    from trainer.backends.megatron.dispatch import LocalTokenDispatcher
    from trainer.config import ActorConfig, ConfigError, load_config

    assert ActorConfig().megatron.resolved_token_dispatcher() == "local"
    assert ActorConfig(megatron={"expert_model_parallel_size": 2}).megatron.resolved_token_dispatcher() == "alltoall"
    assert ActorConfig(megatron={"token_dispatcher": "alltoall"}).megatron.resolved_token_dispatcher() == "alltoall"
    with pytest.raises(ConfigError, match=r"actor\.megatron\.token_dispatcher=local.*expert_model_parallel_size=2"):
        load_config(None, ["actor.megatron.token_dispatcher=local", "actor.megatron.expert_model_parallel_size=2"])
    moe = _moe_layer("alltoall")
    with pytest.raises(ValueError, match="moe_expert_capacity_factor=1.0"):
        LocalTokenDispatcher(moe.config.__class__(**{**moe.config.__dict__, "moe_expert_capacity_factor": 1.0}))


def test_the_actor_dispatches_locally_by_default():
    from trainer.backends.megatron.backend import MegatronActor
    from trainer.backends.megatron.dispatch import LocalTokenDispatcher
    from trainer.config import ActorConfig, ModelConfig
    from trainer.models.loading import load_model_and_tokenizer

    hf, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen3_moe"), seed=0)
    for choice, kind in (("auto", LocalTokenDispatcher), ("alltoall", None)):
        cfg = ActorConfig(strategy="megatron", megatron={"token_dispatcher": choice})
        a = MegatronActor.from_hf(hf, cfg, temperature=1.0, max_response_length=4, device=torch.device("cpu"))
        d = a.gpt.decoder.layers[0].mlp.token_dispatcher
        assert isinstance(d, kind) if kind else type(d).__name__ == "MoEAlltoAllTokenDispatcher"
        assert a.bridge.token_dispatcher == ("local" if kind else "alltoall")
