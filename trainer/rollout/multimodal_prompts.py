"""Image prompts for server engines: what vLLM expects next to the trainer's expanded prompt ids.

The trainer's prompt ids carry each image as ``grid_thw.prod() // merge**2`` copies of
``<|image_pad|>`` (`trainer.data.multimodal`), the layout its forward needs. vLLM runs the model's
multimodal processor itself: it wants ONE placeholder token per image, with the images in
``multi_modal_data``, and expands them. Handing it the expanded ids expands them a second time and
corrupts the prompt (the failure TRL's GRPO trainer had, huggingface/trl#6294). So:

    prompt = vllm_prompt(prompt_ids, images, image_token_id)
    # {"prompt_token_ids": ids with each run of image tokens collapsed to one,
    #  "multi_modal_data": {"image": [PIL images]}}             -> vllm.inputs.TokensPrompt(**prompt)
    check_expansion(prompt_ids, request_output.prompt_token_ids)   # vLLM's expansion == the trainer's

`check_expansion` compares vLLM's expanded prompt (``RequestOutput.prompt_token_ids``) with the
trainer's: equal lengths and tokens mean both image processors produced the same grid, so the
log-probs are comparable. The vLLM engine (`trainer/rollout/vllm_engine.py`) builds every image
request with `vllm_prompt` and checks each one's first output with `check_expansion`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def collapse_image_tokens(ids: Sequence[int], image_token_id: int) -> list[int]:
    """`ids` with every run of consecutive `image_token_id` replaced by one of it."""
    out: list[int] = []
    for tok in ids:
        if tok == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(int(tok))
    return out


def vllm_prompt(prompt_ids: Sequence[int], images: Sequence[Any], image_token_id: int) -> dict[str, Any]:
    """The keyword arguments of a `vllm.inputs.TokensPrompt` for one image prompt (module docstring)."""
    ids = collapse_image_tokens(prompt_ids, image_token_id)
    if ids.count(image_token_id) != len(images):
        raise ValueError(f"prompt has {ids.count(image_token_id)} image placeholder(s) for {len(images)} image(s)")
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": list(images)}}


def check_expansion(ours: Sequence[int], engine: Sequence[int]) -> None:
    """ValueError naming the first difference when the engine expanded the images differently."""
    if list(ours) == list(engine):
        return
    first = next((i for i, (a, b) in enumerate(zip(ours, engine)) if a != b), min(len(ours), len(engine)))
    raise ValueError(f"the engine expanded the image prompt to {len(engine)} tokens, the trainer to {len(ours)} "
                     f"(first difference at token {first}): the two image processors disagree on the image grid "
                     "(fix: give the engine the model folder's preprocessor_config.json)")
