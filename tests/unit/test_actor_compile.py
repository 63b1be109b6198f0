"""`actor.compile: true` against the eager path on a tiny Qwen2, on CPU.

Checks that would fail if the compiled path were wrong or unstable:
- the LM-head chunk functions under `torch.compile` (padded last chunk) give the eager log-probs,
  entropy and hidden/weight gradients; fp32 throughout, so the tolerance is 1e-5 relative
  (measured ~1e-7: only the summation order differs);
- a 10-layer model trained through `Actor.update` with shared prompts (groups of 2) and two
  micro-batch widths compiles a fixed set of graphs (no dynamo recompile-limit fallback, no graph
  break), the second step compiles nothing new, and the loss / gradients / updated weights match
  the eager actor: metrics and all gradients within 1e-4 relative (fp32 on CPU), the weight change of
  two AdamW steps within 1e-2 relative (Adam's early steps are ~lr * sign(g), so a gradient that is
  zero in exact arithmetic, such as the k_proj bias's, moves by +-lr on rounding noise in both paths).

The decoder uses the `aot_eager` backend (dynamo + AOTAutograd, no code generation), which keeps the
file fast on CPU; the LM-head test uses inductor, the production backend (marked slow: C++ compile).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from trainer.backends.actor import Actor
from trainer.components.batch import batch_from_rollout
from trainer.config import ActorConfig, ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.ops.logprobs import lm_head_logprobs
from trainer.rollout.base import Rollout

R = 24


def _model(layers: int) -> torch.nn.Module:
    model, _ = load_model_and_tokenizer(ModelConfig(path="tiny:qwen2", override_config={"num_hidden_layers": layers}),
                                        seed=0)
    return model


def _batch(vocab: int, resp_len: int, seed: int):
    """4 responses, 2 prompts x 2 (shared prompts), the last response shorter than the others."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (2, 6), generator=g).repeat_interleave(2, 0).tolist()
    resp = torch.randint(3, vocab, (4, resp_len), generator=g).tolist()
    resp[-1] = resp[-1][: resp_len - 5]
    roll = Rollout(prompt_ids=prompts, response_ids=resp, response_logprobs=[[-1.0] * len(r) for r in resp],
                   finish_reasons=["length"] * 4, group_index=[0, 0, 1, 1])
    b = batch_from_rollout(roll, pad_token_id=0)
    b.advantages = torch.randn(b.response_mask.shape, generator=g) * b.response_mask
    return b


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.slow
def test_compiled_lm_head_chunks_match_eager_with_padded_last_chunk():
    torch.manual_seed(0)
    m, hid, vocab, chunk = 300, 16, 97, 128  # chunks 128, 128, 44 (the last padded to min(128, ROW_MULTIPLE) rows)
    head = torch.nn.Linear(hid, vocab, bias=False)
    h = torch.randn(m, hid, requires_grad=True)
    t = torch.randint(0, vocab, (m,))
    g_lp, g_h = torch.randn(m), torch.randn(m)
    out = {}
    for backend in (None, "inductor"):
        h.grad, head.weight.grad = None, None
        lp, ent = lm_head_logprobs(h, head, t, temperature=0.7, chunk_size=chunk, with_entropy=True,
                                   compile_backend=backend)
        ((lp * g_lp).sum() + (ent * g_h).sum()).backward()
        out[backend] = (lp.detach(), ent.detach(), h.grad.clone(), head.weight.grad.clone())
    ref = torch.log_softmax(head(h.detach()) / 0.7, -1)  # independent reference for the log-probs
    assert _rel(out["inductor"][0], ref.gather(-1, t[:, None]).squeeze(-1)) < 1e-5
    for a, b in zip(out["inductor"], out[None]):
        assert _rel(a, b) < 1e-5


def _actor(model: torch.nn.Module, compile: bool) -> Actor:
    cfg = ActorConfig(lr=1e-3, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, grad_clip=1e9, entropy_coeff=0.01,
                      compile=compile, compile_backend="aot_eager", logprob_chunk_size=16)
    return Actor(model, cfg, temperature=1.0, max_response_length=R, device=torch.device("cpu"))


def test_compiled_actor_update_matches_eager_and_compiles_a_fixed_set_of_graphs():
    torch._dynamo.reset()
    counters.clear()
    eager_model = _model(10)
    comp_model = copy.deepcopy(eager_model)
    eager, comp = _actor(eager_model, False), _actor(comp_model, True)
    vocab = eager_model.config.vocab_size
    graphs = []
    for step, resp_len in enumerate((R, R - 3)):  # widths 30 and 27 tokens: one 128-token bucket
        batch = _batch(vocab, resp_len, seed=step)
        me = eager.update(copy.deepcopy(batch), 1, reuse_forward_as_old=True)
        mc = comp.update(copy.deepcopy(batch), 1, reuse_forward_as_old=True)
        for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert mc[k] == pytest.approx(me[k], rel=1e-4, abs=1e-6), k
        graphs.append(counters["stats"]["unique_graphs"])
        # gradients of the last micro-batch accumulation (left on the params by update), all params at once:
        # per-tensor errors are meaningless for the k_proj bias, whose exact gradient is 0 (softmax shift)
        ge = torch.cat([p.grad.flatten() for p in eager_model.parameters()])
        gc = torch.cat([p.grad.flatten() for p in comp_model.parameters()])
        assert _rel(gc, ge) < 1e-4
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs[0] >= 1 and graphs[1] == graphs[0]  # the second step (new width, same bucket) compiled nothing
    # the shared-prompt KV path would compile one graph per layer (10 > the default limit of 8)
    assert graphs[0] <= 4
    w0 = torch.cat([p.detach().flatten() for p in _model(10).parameters()])
    we = torch.cat([p.detach().flatten() for p in eager_model.parameters()])
    wc = torch.cat([p.detach().flatten() for p in comp_model.parameters()])
    # two AdamW steps at lr 1e-3 moved the weights; the compiled update moved them the same way
    assert float((we - w0).norm()) > 1e-2
    assert _rel(wc - w0, we - w0) < 1e-2  # Adam's first steps are ~lr * sign(g): near-zero grads can flip


def test_compile_runs_in_process_unless_the_environment_chooses(monkeypatch):
    import torch._inductor.config as inductor_config

    from trainer.backends.compile import compile_in_process

    monkeypatch.setattr(inductor_config, "compile_threads", 8)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "4")
    compile_in_process()
    assert inductor_config.compile_threads == 8  # the environment's choice is left to inductor
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS")
    compile_in_process()
    assert inductor_config.compile_threads == 1  # no worker pool (see trainer/backends/compile.py)
