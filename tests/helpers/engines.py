"""Helpers for driving rollout engines in tests, and an SGLang-shaped double (SGLang is not installable
here): `FakeSGLangEngine` answers `sglang.Engine`'s generate / weight / memory calls the way sglang
0.5.23 does and records them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


def stop_after(k: int) -> Callable[[], bool]:
    """A `should_stop` that answers False k times, then True (an interrupt after k decode steps)."""
    calls = {"n": 0}

    def fn() -> bool:
        calls["n"] += 1
        return calls["n"] > k
    return fn


def sgl_out(ids: list[int], lps: list[float], reason: dict[str, Any] | None, output_ids: list[int] | None = None,
            rid: str = "r", index: int | None = None) -> dict:
    out = {"text": None, "output_ids": ids if output_ids is None else output_ids,
           "meta_info": {"id": rid, "output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids)],
                         "finish_reason": reason, "completion_tokens": len(ids)}}
    if index is not None:
        out["index"] = index
    return out


class FakeTokenizerManager:  # sglang.srt.managers.tokenizer_manager.TokenizerManager.abort_request
    def __init__(self, engine: FakeSGLangEngine) -> None:
        self.engine = engine

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.engine.aborted.append(rid)


@dataclass
class FakeSGLangEngine:
    """`sglang.Engine.generate(input_ids, sampling_params, return_logprob, rid, stream)` and the weight /
    memory calls. `script(row, sampling_params)` gives a request's whole response; streamed, each
    chunk is the cumulative output of one request after one more token (SGLang's default)."""

    script: Any = None
    calls: list[Any] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    result: Any = (True, "ok")
    updates: list[tuple[list[tuple[str, torch.Tensor]], bool]] = field(default_factory=list)  # tensors, flush

    def __post_init__(self) -> None:
        self.tokenizer_manager = FakeTokenizerManager(self)

    def generate(self, input_ids: list[list[int]], sampling_params: list[dict], return_logprob: bool = False,
                 rid: list[str] | None = None, stream: bool = False) -> Any:
        self.calls.append(("generate", input_ids, sampling_params, return_logprob, rid, stream))
        full = [self.script(row, sp) for row, sp in zip(input_ids, sampling_params)]
        if not stream:
            return [sgl_out(t, lp, {"type": r}, rid=rid[i]) for i, (t, lp, r) in enumerate(full)]

        def chunks():
            k = 0
            live = set(range(len(full)))
            while live:
                k += 1
                for i in sorted(live):
                    toks, lps, reason = full[i]
                    if rid[i] in self.aborted:
                        live.discard(i)
                        yield sgl_out(toks[:k - 1], lps[:k - 1], {"type": "abort"}, rid=rid[i], index=i)
                    elif k >= len(toks):
                        live.discard(i)
                        yield sgl_out(toks, lps, {"type": reason}, rid=rid[i], index=i)
                    else:
                        yield sgl_out(toks[:k], lps[:k], None, rid=rid[i], index=i)
        return chunks()

    def update_weights_from_tensor(self, named_tensors: list, load_format: str | None = None,
                                   flush_cache: bool = True) -> Any:
        self.calls.append(("update", [n for n, _ in named_tensors], flush_cache))
        self.updates.append(([(n, t.detach().clone()) for n, t in named_tensors], flush_cache))
        return self.result

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append("release")

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append("resume")
