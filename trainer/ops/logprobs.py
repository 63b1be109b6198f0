"""Per-token log-probabilities and entropy of the response, without full-batch fp32 logits.

The trainer and every rollout engine use the same definition:

    logp_t = log_softmax(logits_t / temperature)[token_t]        (fp32)
    H_t    = -sum_v softmax(z)_v * log_softmax(z)_v,  z = logits_t / temperature

Shared prompts: the n responses of a prompt share it, so by default the prompt is run once per
group and its KV cache (with its autograd graph) is handed to the group's n responses; the
response tokens then run as one continuation. Same math as running every full sequence (the
test compares both), with n-1 of every n prompt forwards saved. Rows are grouped when
consecutive rows carry the same `group_index` and the same prompt tokens; otherwise the plain
full-sequence forward runs.

The LM head runs only on response positions (hidden states at columns P-1 .. P+R-2), in chunks of
`chunk_size` tokens; with gradients on, each chunk is recomputed in backward
(`torch.utils.checkpoint`) so no more than one chunk of `[chunk, V]` fp32 logits is alive at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainer.batch import Batch


def _chunk_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                    temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias).float() / temperature  # [C, V]
    logp_all = torch.log_softmax(logits, dim=-1)  # [C, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [C]
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # [C]
    else:
        entropy = torch.zeros_like(logp)
    return logp, entropy


def lm_head_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, *, temperature: float = 1.0,
                     chunk_size: int = 1024, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropy) of `targets` [..] given final hidden states [.., H], chunked over tokens."""
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])  # [M, H]
    t = targets.reshape(-1)  # [M]
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    use_ckpt = torch.is_grad_enabled() and h.requires_grad and h.shape[0] > chunk_size
    lps, ents = [], []
    for i in range(0, h.shape[0], chunk_size):
        args = (h[i:i + chunk_size], weight, bias, t[i:i + chunk_size], temperature, with_entropy)
        lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False) if use_ckpt else _chunk_logprobs(*args)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps).reshape(shape), torch.cat(ents).reshape(shape)


def prompt_groups(batch: Batch) -> torch.Tensor | None:
    """Start row of each run of consecutive rows sharing one prompt, or None if sharing saves nothing."""
    g = batch.group_index
    starts = torch.ones_like(g, dtype=torch.bool)
    starts[1:] = g[1:] != g[:-1]
    first = starts.nonzero().squeeze(-1)  # [G]
    if first.numel() == len(batch):
        return None
    owner = first.repeat_interleave(torch.diff(torch.cat([first, torch.tensor([len(batch)])])))  # [N]
    p = batch.prompt_len
    same = (batch.input_ids[:, :p] == batch.input_ids[owner, :p]).all() and \
        (batch.attention_mask[:, :p] == batch.attention_mask[owner, :p]).all()
    return first if bool(same) else None


def _shared_prompt_hidden(base: torch.nn.Module, batch: Batch, first: torch.Tensor) -> torch.Tensor:
    from transformers import DynamicCache

    p = batch.prompt_len
    counts = torch.diff(torch.cat([first, torch.tensor([len(batch)], device=first.device)]))  # [G]
    cache = DynamicCache()
    prompt_out = base(input_ids=batch.input_ids[first, :p], attention_mask=batch.attention_mask[first, :p],
                      position_ids=batch.position_ids[first, :p], past_key_values=cache, use_cache=True)
    owner = torch.arange(first.numel(), device=first.device).repeat_interleave(counts)  # [N] group of each row
    cache.batch_select_indices(owner)  # each response gets (a differentiable copy of) its prompt's KV
    resp_out = base(input_ids=batch.input_ids[:, p:], attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids[:, p:], past_key_values=cache, use_cache=True)
    last_prompt = prompt_out.last_hidden_state[owner, -1:]  # [N, 1, H] predicts response token 0
    return torch.cat([last_prompt, resp_out.last_hidden_state[:, :-1]], dim=1)  # [N, R, H]


def response_hidden_states(model: torch.nn.Module, batch: Batch, *, share_prompts: bool = True) -> torch.Tensor:
    """Final hidden states that predict each response token: `[N, R, H]`."""
    base = getattr(model, model.base_model_prefix)
    ckpt_attr = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    if share_prompts and not getattr(model, ckpt_attr, False):
        first = prompt_groups(batch.to("cpu") if batch.group_index.device.type != "cpu" else batch)
        if first is not None:
            return _shared_prompt_hidden(base, batch, first.to(batch.input_ids.device))
    out = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
               use_cache=False)
    hidden = out.last_hidden_state  # [N, P+R, H]
    p, r = batch.prompt_len, batch.responses.shape[1]
    return hidden[:, p - 1:p - 1 + r]  # [N, R, H]


def response_logprobs(model: torch.nn.Module, batch: Batch, *, temperature: float = 1.0, chunk_size: int = 1024,
                      with_entropy: bool = False, share_prompts: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logprobs [N, R], entropy [N, R])` of the batch's responses under `model`."""
    hidden = response_hidden_states(model, batch, share_prompts=share_prompts)
    return lm_head_logprobs(hidden, model.get_output_embeddings(), batch.responses, temperature=temperature,
                            chunk_size=chunk_size, with_entropy=with_entropy)
