"""The vLLM engine's image requests, driven with a fake shaped like vllm 0.32's `LLMEngine`.

The real vLLM runs them in tests/engines/test_vllm_vlm.py (where torchvision imports); these
pin what the adapter sends (one placeholder per image, the images in `multi_modal_data`), that
it checks vLLM's expansion against the trainer's prompt, drops the call's other requests when
that check fails, and resets vLLM's encoder cache at a weight update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from trainer.rollout.base import SamplingParams
from trainer.rollout.vllm_engine import VLLMRolloutEngine

IMG = 9  # the <|image_pad|> id of these tests


@dataclass
class Out:  # vllm.outputs.RequestOutput / CompletionOutput, DELTA kind
    request_id: str
    outputs: list[Any]
    prompt_token_ids: list[int] | None


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Any]]
    finish_reason: str | None


@dataclass
class Lp:
    logprob: float


class FakeEngine:
    """Expands each image placeholder to `tokens_per_image` copies (vLLM's processor), answers [5, 2]."""

    def __init__(self, tokens_per_image: int):
        self.per = tokens_per_image
        self.added: list[tuple[str, dict]] = []
        self.live: dict[str, list[int]] = {}
        self.aborted: list[str] = []
        self.encoder_resets = 0

    def add_request(self, rid: str, prompt: dict, params: Any) -> None:
        self.added.append((rid, prompt))
        ids = [t for tok in prompt["prompt_token_ids"] for t in ([tok] * self.per if tok == IMG else [tok])]
        self.live[rid] = ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def abort_request(self, rids: list[str], internal: bool = False) -> None:
        self.aborted.extend(rids)
        for r in rids:
            self.live.pop(r, None)

    def step(self) -> list[Out]:
        outs = [Out(rid, [Completion([5, 2], [{5: Lp(-0.5)}, {2: Lp(-0.1)}], "stop")], ids)
                for rid, ids in self.live.items()]
        self.live.clear()
        return outs

    def reset_encoder_cache(self) -> None:
        self.encoder_resets += 1


class FakeLLM:
    def __init__(self, per: int):
        self.llm_engine = FakeEngine(per)

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        return [len(args[0])]

    def reset_prefix_cache(self) -> bool:
        return True


def engine(per: int = 3, image_token_id: int | None = IMG) -> VLLMRolloutEngine:
    return VLLMRolloutEngine(FakeLLM(per), eos_token_ids=[2], weight_specs=[], in_process=True,
                             image_token_id=image_token_id)


PROMPTS = [[1, 7, IMG, IMG, IMG, 8, 4], [1, 4]]  # an image prompt (3 image tokens) and a text prompt
IMAGES = [["<figure>"], None]


def test_image_requests_carry_one_placeholder_per_image_and_the_images():
    e = engine(per=3)
    assert e.takes_images
    r = e.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4), multi_modal_inputs=[{}, None], images=IMAGES)
    sent = [p for _, p in e.llm.llm_engine.added]
    assert sent[0] == {"prompt_token_ids": [1, 7, IMG, 8, 4], "multi_modal_data": {"image": ["<figure>"]}}
    assert sent[1] == sent[0] and sent[2] == {"prompt_token_ids": [1, 4]}  # n=2 rows each; text rows as before
    assert r.prompt_ids == [PROMPTS[0]] * 2 + [PROMPTS[1]] * 2  # the trainer's expanded ids, for its forward
    assert r.response_ids == [[5, 2]] * 4 and r.response_logprobs[0] == [-0.5, -0.1] and r.group_index == [0, 0, 1, 1]


def test_an_expansion_unlike_the_trainers_is_an_error_and_drops_the_call():
    e = engine(per=4)  # vLLM's processor makes 4 image tokens where the trainer's made 3
    with pytest.raises(ValueError, match=r"expanded the image prompt to 8 tokens, the trainer to 7 \(first difference at token 5\)"):
        e.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=4), multi_modal_inputs=[{}], images=IMAGES[:1])


def test_image_prompts_need_images_and_a_vision_language_engine():
    with pytest.raises(ValueError, match="need their decoded images"):
        engine().generate(PROMPTS, SamplingParams(), multi_modal_inputs=[{}, None])
    with pytest.raises(ValueError, match="text-only"):
        engine(image_token_id=None).generate(PROMPTS, SamplingParams(), multi_modal_inputs=[{}, None], images=IMAGES)
    with pytest.raises(ValueError, match="1 image placeholder"):  # two images, one placeholder
        engine().generate(PROMPTS[:1], SamplingParams(), multi_modal_inputs=[{}], images=[["a", "b"]])


def test_weight_update_resets_the_encoder_cache_of_a_vision_language_engine():
    e, text = engine(), engine(image_token_id=None)
    for x in (e, text):
        x.update_weights([("model.language_model.embed_tokens.weight", torch.zeros(2, 2))])
    assert e.llm.llm_engine.encoder_resets == 1 and text.llm.llm_engine.encoder_resets == 0


def test_steps_generate_hands_images_only_to_engines_that_take_them():
    from trainer.modes.steps import generate

    seen: list[dict] = []

    class Recorder:
        takes_images = False

        def generate(self, prompts, params, **kw):
            seen.append(kw)  # answers as the image engine would
            return engine().generate(prompts, params, multi_modal_inputs=kw["multi_modal_inputs"], images=IMAGES[:1])

    items = [{"prompt_ids": PROMPTS[0], "multi_modal_inputs": {"pixel_values": torch.zeros(1)}, "images": ["<figure>"],
              "data_source": "d", "ground_truth": "1", "extra_info": {}}]
    rec = Recorder()
    generate(rec, items, SamplingParams(n=1, max_new_tokens=2), pad_token_id=0, max_response_length=2)
    rec.takes_images = True
    generate(rec, items, SamplingParams(n=1, max_new_tokens=2), pad_token_id=0, max_response_length=2)
    assert "images" not in seen[0] and seen[1]["images"] == [["<figure>"]]
    assert "multi_modal_inputs" in seen[0] and "multi_modal_inputs" in seen[1]
