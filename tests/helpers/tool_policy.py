"""A tiny Llama whose weights write a fixed tool-use script: the tool loop on real engines, no stubs.

A random-init tiny model never writes a tool call, so the loop's real-engine tests use this one.
What is real: the engines (`hf`, `static`, vLLM), their sampling and log-probs, the weight updates,
the sandbox. What is arranged: the vocabulary and the weights. The tokenizer is the project's tiny
byte-level BPE plus a few added tokens, each one whole piece of text (the full tool call, the
answer line); the model is a 1-layer Llama whose attention and MLP outputs are zero
(`o_proj`, `down_proj`), so the next-token logits depend on the current token only, and whose LM
head puts logit `MARGIN` on one successor per source token (orthogonal embeddings, so no two
rules interfere; every other logit is 0):

    Q (the prompt's last token) -> CALL (<tool_call>{... "code": CODE}</tool_call>, one token) -> EOS
    the observation's last token -> SO ("So") -> ANSWER[version] -> EOS

`ANSWER[0]` is "Answer: \\boxed{41}" and `ANSWER[1]` "Answer: \\boxed{42}": `weights(v)` are the
weights of policy version v, so which answer a trajectory holds says which weights sampled it.
With MARGIN = 20 the scripted token has probability 1 - 3e-7 per step at temperature 1 (the
log-prob the engines report, about -3e-7, is real). `save(folder)` writes a HF folder (model and
tokenizer, whose chat template renders the messages and then Q) for vLLM and the trainer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.helpers.engines import stop_after
from trainer.agent.loop import OBS_CLOSE
from trainer.rollout.base import EngineWrapper, InterruptibleEngine

MARGIN = 20.0
CODE = "print(6 * 7)"
ANSWERS = ("Answer: \\boxed{41}", "Answer: \\boxed{42}")
Q_TOKEN = "<|q|>"
TEMPLATE = ("{% for message in messages %}{{ message['content'] + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|q|>' }}{% endif %}")


def call_text(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "execute_python_code", "arguments": {"code": code}}) + "</tool_call>"


class ToolPolicy:
    """The tokenizer, the model (version 0) and the weights of each version (module docstring)."""

    def __init__(self, code: str = CODE, seed: int = 0) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        from trainer.data.tiny_tokenizer import build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        tok.add_tokens([Q_TOKEN], special_tokens=True)
        tok.add_tokens([call_text(code), "So", *ANSWERS])
        tok.chat_template = TEMPLATE
        self.tok = tok
        ids = lambda text: tok.convert_tokens_to_ids(text)
        self.q, self.call, self.so = ids(Q_TOKEN), ids(call_text(code)), ids("So")
        self.answers = [ids(a) for a in ANSWERS]
        self.eos = tok.convert_tokens_to_ids("<|im_end|>")
        self.obs_end = tok.encode(OBS_CLOSE, add_special_tokens=False)[-1]
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=self.eos,
                          pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        self.model = LlamaForCausalLM(cfg).eval()
        self.model.load_state_dict(self.weights(0), strict=False)

    def table(self, version: int) -> dict[int, int]:
        """Source token -> scripted successor under the weights of `version`."""
        return {self.q: self.call, self.call: self.eos, self.obs_end: self.so,
                self.so: self.answers[min(version, 1)], self.answers[0]: self.eos, self.answers[1]: self.eos}

    def weights(self, version: int) -> dict[str, torch.Tensor]:
        """The parameters that carry the script of `version` (the rest keep their random init)."""
        sd = {k: v.clone() for k, v in self.model.state_dict().items()}
        d = self.model.config.hidden_size
        table = self.table(version)
        sources = sorted(set(table))
        basis = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(7)))[0]  # orthonormal
        emb = sd["model.embed_tokens.weight"]
        head = torch.zeros_like(sd["lm_head.weight"])
        for k, src in enumerate(sources):
            emb[src] = basis[:, k] * d ** 0.5  # RMS 1: the final RMSNorm leaves it as it is
            head[table[src]] += MARGIN * basis[:, k] / d ** 0.5
        sd["lm_head.weight"] = head
        for name in list(sd):
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                sd[name] = torch.zeros_like(sd[name])
        return sd

    def named_weights(self, version: int) -> list[tuple[str, torch.Tensor]]:
        """`weights(version)` as an engine's `update_weights` takes them (the model's parameter order)."""
        sd = self.weights(version)
        return [(name, sd[name]) for name, _ in self.model.named_parameters()]

    def prompt(self, text: str = "What is 6 * 7?") -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) + [self.q]

    def save(self, folder: Path) -> str:
        self.model.save_pretrained(folder, safe_serialization=True)
        self.tok.save_pretrained(folder)
        return str(folder)


class InterruptInAnswer(EngineWrapper, InterruptibleEngine):
    """The real engine; its first decode of an answer segment is interrupted after `steps` checks of
    `should_stop` (hf, static, vLLM: before each decode step; SGLang: after each streamed chunk)."""

    def __init__(self, inner: InterruptibleEngine, obs_end: int, steps: int = 1) -> None:
        self.inner, self.obs_end, self.steps, self.fired = inner, obs_end, steps, False

    def decode_rows(self, rows, budgets, params, should_stop):
        if not self.fired and rows[0][-1] == self.obs_end:
            self.fired = True
            should_stop = stop_after(self.steps)
        return self.inner.decode_rows(rows, budgets, params, should_stop)
