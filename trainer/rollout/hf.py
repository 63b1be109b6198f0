"""The built-in `hf` rollout engine: batched sampling on a transformers model with a KV cache.

Runs anywhere transformers runs (CPU included). Prompts are left-padded into one batch, prefilled
once, then decoded one token per forward with the model's KV cache. Each sampled token's
log-probability is taken from `log_softmax(logits / temperature)` in fp32, the definition the
trainer uses (`trainer/ops/logprobs.py`), so rollout-vs-trainer mismatch measures numerics only.
Top-k / top-p filter what can be *sampled*; the reported log-prob is under the unfiltered
temperature-scaled distribution (the trainer cannot apply the filters; with the default
top_k=-1, top_p=1 the two agree). Identical rows (a prompt's n samples, with the same images) are
prefilled once and their KV cache is copied to each sample before the first token is sampled, and the
prefill computes the logits of the last position only: the prefill of a group of n costs what one
row does (the GRPO cpu profile's generation: 29% less time, the same samples; reports/cpu/ci_time.md).
Finished rows are dropped from the batch as they finish, so late decode steps run on the rows still going.

The engine owns its copy of the weights (possibly in another dtype than the trainer's);
`update_weights` copies the trainer's tensors in place. `generate(..., should_stop=)` and
`continue_generation` (partial rollout) come from `InterruptibleEngine` (trainer/rollout/base.py).

Images: `generate(prompts, params, multi_modal_inputs=[...])` takes one ``{"pixel_values",
"image_grid_thw"}`` dict (or None) per prompt for a vision-language policy (`trainer/models/vlm.py`).
The prefill runs `multimodal_hidden_states` (image features in the prompt's image-token slots,
M-RoPE positions), the forward the trainer recomputes log-probs with; decode steps feed the
sampled tokens at the next text position of each row. `continue_generation` does not take images.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import torch
from transformers import DynamicCache, PreTrainedModel

from trainer.rollout.base import (
    InterruptibleEngine,
    Rollout,
    SamplingParams,
    copy_weights_in_place,
    engine_model,
)
from trainer.rollout.decode_cache import decode_cache

# transformers 5.x renames `past_key_values` to `cache`; the old name works across 4.56-5.x.
warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated")


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row of `logits` [B, V] and return `(tokens [B], logprobs [B])`."""
    if params.greedy:
        logp = torch.log_softmax(logits.float(), dim=-1)
        tokens = logp.argmax(-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits.float() / params.temperature  # [B, V]
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
    masked = scaled
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(masked, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) > params.top_p  # keep the token that crosses top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        masked = masked.masked_fill(drop, float("-inf"))
    probs = torch.softmax(masked, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [B]
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class HFRolloutEngine(InterruptibleEngine):
    name = "hf"

    def __init__(self, model: PreTrainedModel, *, pad_token_id: int, eos_token_ids: list[int], seed: int = 0,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None, share_weights: bool = False):
        self.model = engine_model(model, dtype=dtype, device=device, share_weights=share_weights)
        self.device = next(self.model.parameters()).device
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.version = 0
        self._params = dict(self.model.named_parameters())

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights_in_place(self._params, named_tensors)
        self.version += 1

    # ------------------------------------------------------------------ sampling
    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 should_stop: Callable[[], bool] | None = None,
                 multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None = None) -> Rollout:
        """`InterruptibleEngine.generate`, plus each prompt's images for a vision-language policy."""
        if multi_modal_inputs is None:
            return super().generate(prompts, params, should_stop=should_stop)
        from trainer.models.vlm import is_vlm

        if not is_vlm(self.model):
            raise ValueError("hf engine: prompts carry images but the policy is a text-only model")
        n = params.n
        rows = [list(p) for p in prompts for _ in range(n)]
        mm = [m for m in multi_modal_inputs for _ in range(n)]
        tokens, logps, finish = self.decode_rows(rows, [params.max_new_tokens] * len(rows), params, should_stop,
                                                 multi_modal_inputs=mm)
        return Rollout(prompt_ids=rows, response_ids=tokens, response_logprobs=logps, finish_reasons=finish,
                       group_index=[i // n for i in range(len(rows))], policy_version=[self.version] * len(rows))

    def _prefill(self, input_ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: DynamicCache,
                 multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(last-position logits [B, V], next position [B, 1])` after prefilling the left-padded prompts."""
        if multi_modal_inputs is None:
            logits = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos, past_key_values=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1]
            return logits, pos[:, -1:] + 1
        from trainer.models.vlm import multimodal_hidden_states

        hidden, mrope = multimodal_hidden_states(self.model, input_ids, attn, multi_modal_inputs,
                                                 image_cols=input_ids.shape[1], cache=cache)  # [B, P, H], [3, B, P]
        logits = self.model.get_output_embeddings()(hidden[:, -1])  # [B, V]
        return logits, mrope.amax(dim=(0, 2))[:, None] + 1  # text positions continue after the largest M-RoPE one

    @torch.no_grad()
    def decode_rows(self, rows: list[list[int]], budgets: list[int], params: SamplingParams,
                    should_stop: Callable[[], bool] | None,
                    multi_modal_inputs: list[dict[str, torch.Tensor] | None] | None = None
                    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Left-pad `rows`, prefill each distinct row once, decode until each row stops, exhausts its budget
        or is interrupted."""
        b = len(rows)
        # distinct rows (same tokens, same image dict): prefilled once, then the cache is copied to each row
        distinct: dict[tuple, int] = {}
        firsts: list[int] = []  # the first row of each distinct row
        src: list[int] = []  # the distinct row of each row
        for i, r in enumerate(rows):
            key = (tuple(r), None if multi_modal_inputs is None else id(multi_modal_inputs[i]))
            if key not in distinct:
                distinct[key] = len(firsts)
                firsts.append(i)
            src.append(distinct[key])
        p_len = max(len(r) for r in rows)
        input_ids = torch.full((len(firsts), p_len), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(firsts), p_len), dtype=torch.long)
        for j, i in enumerate(firsts):
            input_ids[j, p_len - len(rows[i]):] = torch.tensor(rows[i], dtype=torch.long)
            attn[j, p_len - len(rows[i]):] = 1
        input_ids, attn = input_ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        mm_distinct = None if multi_modal_inputs is None else [multi_modal_inputs[i] for i in firsts]
        stop = torch.tensor(sorted(set(self.eos_token_ids) | set(params.stop_token_ids)), device=self.device)
        budget = torch.tensor(budgets, device=self.device)  # [B] new tokens each row may still sample

        out_tokens: list[list[int]] = [[] for _ in range(b)]
        out_logps: list[list[float]] = [[] for _ in range(b)]
        finish = ["length"] * b
        alive = torch.arange(b, device=self.device)  # original row of each batch row still decoding

        cache = decode_cache(self.model)
        logits, next_pos = self._prefill(input_ids, attn, pos, cache, mm_distinct)  # [D, V], [D, 1]
        if len(firsts) < b:  # every row gets its distinct row's logits, positions, mask and cache
            expand = torch.tensor(src, device=self.device)
            logits, next_pos, attn = logits[expand], next_pos[expand], attn[expand]
            cache.batch_select_indices(expand)
        toks_hist, lps_hist, rows_hist = [], [], []
        for t in range(int(budget.max())):
            if should_stop is not None and should_stop():
                for row in alive.tolist():
                    finish[row] = "abort"
                break
            tokens, logps = sample_next(logits, params, self.generator)  # [B'], [B']
            toks_hist.append(tokens)
            lps_hist.append(logps)
            rows_hist.append(alive)
            stopped = torch.isin(tokens, stop)  # [B']
            for row in alive[stopped].tolist():
                finish[row] = "stop"
            done = stopped | (budget[alive] <= t + 1)  # rows that hit their budget keep "length"
            if done.any():
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                alive, tokens, next_pos = alive[keep], tokens[keep], next_pos[keep]
                attn = attn[keep]
                cache.batch_select_indices(keep)
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
            logits = self.model(input_ids=tokens[:, None], attention_mask=attn, position_ids=next_pos,
                                past_key_values=cache, use_cache=True).logits[:, -1]
            next_pos = next_pos + 1
        for toks, lps, rws in zip(toks_hist, lps_hist, rows_hist):
            for row, tok, lp in zip(rws.tolist(), toks.tolist(), lps.tolist()):
                out_tokens[row].append(tok)
                out_logps[row].append(lp)
        return out_tokens, out_logps, finish
