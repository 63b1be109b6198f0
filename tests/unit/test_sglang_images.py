"""The SGLang engine's image requests, driven with a fake shaped like sglang 0.5.23's `Engine.generate`.

SGLang is not run in this project (docs/hardware.md); this pins what the adapter sends for image
prompts (the trainer's expanded ids with the processed pixels in SGLang's "processor_output"
format, one list per request, None for text rows) and that a prompt SGLang counts differently
from the trainer is an error.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainer.rollout.base import SamplingParams
from trainer.rollout.sglang_engine import SGLangRolloutEngine


class FakeEngine:
    """`generate(input_ids, sampling_params, return_logprob, rid, image_data)`: answers [5, 2]; counts
    `extra` more prompt tokens for image requests (a second expansion) when asked to."""

    def __init__(self, extra: int = 0):
        self.extra = extra
        self.calls: list[dict[str, Any]] = []

    def generate(self, **kw: Any) -> list[dict[str, Any]]:
        self.calls.append(kw)
        images = kw.get("image_data") or [None] * len(kw["input_ids"])
        return [{"output_ids": [5, 2], "meta_info": {
            "output_token_logprobs": [(-0.5, 5, None), (-0.1, 2, None)], "finish_reason": {"type": "stop"},
            "prompt_tokens": len(ids) + (self.extra if img else 0)}} for ids, img in zip(kw["input_ids"], images)]


MM = {"pixel_values": torch.ones(36, 8), "image_grid_thw": torch.tensor([[1, 6, 6]])}
PROMPTS = [[1, 7, 9, 9, 9, 8], [1, 4]]


def test_image_prompts_go_as_expanded_ids_with_processor_output_items():
    fake = FakeEngine()
    e = SGLangRolloutEngine(fake, eos_token_ids=[2])
    r = e.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4), multi_modal_inputs=[MM, None])
    call = fake.calls[0]
    assert call["input_ids"] == [PROMPTS[0]] * 2 + [PROMPTS[1]] * 2  # the trainer's expanded ids, not collapsed
    first = call["image_data"][0]
    assert len(first) == 1 and first[0]["format"] == "processor_output"
    assert first[0]["pixel_values"] is MM["pixel_values"] and first[0]["image_grid_thw"] is MM["image_grid_thw"]
    assert call["image_data"][2] is None and call["image_data"][3] is None
    assert r.response_ids == [[5, 2]] * 4 and r.group_index == [0, 0, 1, 1]
    e.generate(PROMPTS[1:], SamplingParams(max_new_tokens=4))  # text prompts: no image_data at all
    assert "image_data" not in fake.calls[1]


def test_a_prompt_the_engine_expanded_again_is_an_error():
    e = SGLangRolloutEngine(FakeEngine(extra=8), eos_token_ids=[2])
    with pytest.raises(ValueError, match="the image prompt is 14 tokens in the engine, 6 in the trainer"):
        e.generate(PROMPTS, SamplingParams(max_new_tokens=4), multi_modal_inputs=[MM, None])
