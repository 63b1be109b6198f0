"""Per-token log-probabilities and entropy of the response, without full-batch fp32 logits.

The trainer and every rollout engine use the same definition:

    logp_t = log_softmax(logits_t / temperature)[token_t]        (fp32)
    H_t    = -sum_v softmax(z)_v * log_softmax(z)_v,  z = logits_t / temperature

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


def response_hidden_states(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Final hidden states that predict each response token: `[N, R, H]`."""
    base = getattr(model, model.base_model_prefix)
    out = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
               use_cache=False)
    hidden = out.last_hidden_state  # [N, P+R, H]
    p, r = batch.prompt_len, batch.responses.shape[1]
    return hidden[:, p - 1:p - 1 + r]  # [N, R, H]


def response_logprobs(model: torch.nn.Module, batch: Batch, *, temperature: float = 1.0, chunk_size: int = 1024,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logprobs [N, R], entropy [N, R])` of the batch's responses under `model`."""
    hidden = response_hidden_states(model, batch)
    return lm_head_logprobs(hidden, model.get_output_embeddings(), batch.responses, temperature=temperature,
                            chunk_size=chunk_size, with_entropy=with_entropy)
