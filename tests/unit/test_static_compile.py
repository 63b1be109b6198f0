"""The static engine's `compile_decode` option on CPU: same tokens as the eager step, one graph set for all layers.

The compiled decode step wraps the same pure functions as the eager one, so greedy tokens must match
exactly and log-probs to float32 rounding (aot_eager replays the same aten ops; inductor fuses them into
C++ kernels here, Triton on CUDA). Graph counts come from a counting backend: with one batch bucket and
one temperature, each of the four compiled functions (rope tables, pre-attention, post-attention, LM
head) compiles exactly one graph, whatever the number of layers, because the weights are graph inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainer.config import ModelConfig
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.rollout.base import Rollout, SamplingParams
from trainer.rollout.static import StaticRolloutEngine

PROMPTS = ["12+30=", "what is 13*7? answer:", "hi", "a much longer prompt so the rows are left-padded: 9-4="]
GREEDY = SamplingParams(n=2, greedy=True, max_new_tokens=12)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(arch: str = "qwen2", layers: int = 2):
    # a wide init makes greedy decoding wander over many tokens instead of repeating one
    cfg = ModelConfig(path=f"tiny:{arch}", dtype="float32",
                      override_config={"initializer_range": 0.2, "num_hidden_layers": layers})
    model, tok = load_model_and_tokenizer(cfg, seed=3)
    return model, tok, eos_token_ids(tok, model)


def _generate(arch: str, params: SamplingParams = GREEDY, layers: int = 2, **kw) -> tuple[Rollout, StaticRolloutEngine]:
    model, tok, eos = _model(arch, layers)
    eng = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos, prompt_bucket=8, seed=5, **kw)
    return eng.generate([tok.encode(p) for p in PROMPTS], params), eng


def _assert_same(a: Rollout, b: Rollout, atol: float = 1e-5) -> None:
    assert a.response_ids == b.response_ids
    assert a.finish_reasons == b.finish_reasons
    for x, y in zip(a.response_logprobs, b.response_logprobs):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=atol, rtol=0)


def _counting_backend() -> tuple[Callable, list[int]]:
    """A dynamo backend that runs the captured graph as is and records each graph's node count."""
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(len(gm.graph.nodes))
        return gm.forward
    return backend, graphs


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # qwen2: QKV bias; qwen3: per-head q/k RMSNorm
def test_compiled_greedy_decode_matches_eager(arch: str) -> None:
    ref, _ = _generate(arch)
    out, eng = _generate(arch, compile_decode=True, compile_backend="aot_eager")
    assert len({t for r in ref.response_ids for t in r}) > 4  # not one token repeated
    assert eng.compile_error is None and eng.compile_decode
    assert eng.compile_s > 0
    _assert_same(out, ref)


def test_compiled_sampling_matches_eager_for_the_same_seed() -> None:
    # the exponential race stays eager on the engine's generator, so the draws are the same ones
    params = SamplingParams(n=2, temperature=0.8, top_k=20, max_new_tokens=8)
    ref, _ = _generate("qwen2", params)
    out, eng = _generate("qwen2", params, compile_decode=True, compile_backend="aot_eager")
    assert len({tuple(r) for r in ref.response_ids}) > 1  # sampling, not greedy
    assert eng.compile_error is None
    _assert_same(out, ref)


def test_inductor_greedy_decode_matches_eager() -> None:
    ref, _ = _generate("qwen3")
    out, eng = _generate("qwen3", compile_decode=True)
    assert eng.compile_backend == "inductor" and eng.compile_error is None
    _assert_same(out, ref)


def test_one_graph_per_function_whatever_the_number_of_layers() -> None:
    counts = {}
    for layers in (2, 4):
        torch._dynamo.reset()
        backend, graphs = _counting_backend()
        _generate("qwen3", layers=layers, compile_decode=True, compile_backend=backend)
        counts[layers] = graphs
    # rope tables, pre_attn, post_attn, head: one graph each, shared by every layer and decode step
    assert len(counts[2]) == 4
    assert counts[4] == counts[2]  # same graphs (same node counts), not one more per layer


def test_new_batch_bucket_compiles_one_more_graph_set() -> None:
    model, tok, eos = _model()
    backend, graphs = _counting_backend()
    eng = StaticRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=eos, prompt_bucket=8,
                              compile_decode=True, compile_backend=backend)
    prompts = [tok.encode(p) for p in PROMPTS]
    eng.generate(prompts, GREEDY)  # 8 rows: bucket 8
    eng.generate(prompts, GREEDY)  # same bucket: guards hold, nothing compiled
    assert len(graphs) == 4
    eng.generate(prompts[:1], GREEDY)  # 2 rows: bucket 2, new static shapes
    assert len(graphs) == 8


def test_compile_failure_falls_back_to_eager_and_says_why() -> None:
    def broken(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        raise RuntimeError("no compiler here")

    ref, _ = _generate("qwen2")
    out, eng = _generate("qwen2", compile_decode=True, compile_backend=broken)
    assert not eng.compile_decode
    assert eng.compile_error is not None and "no compiler here" in eng.compile_error
    _assert_same(out, ref)  # the failed warm-up step left no trace in the buffers
