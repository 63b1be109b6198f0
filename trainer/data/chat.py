"""Token ids of a chat prompt, ready for generation.

    from trainer.data.chat import tokenize_prompt
    ids = tokenize_prompt(tokenizer, [{"role": "user", "content": "2 + 3 = ?"}])

With the tokenizer's chat template
(``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``). A tokenizer
without a chat template gets the plain-text fallback ``"role: content"`` lines joined by
newlines, then ``"assistant:"`` on its own line. The lowest module of `trainer.data`: the
dataset, the image prompts and the tool traces all tokenize through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def tokenize_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt ready for generation (the module docstring says how)."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, Mapping) or hasattr(out, "keys"):  # transformers >= 5 returns a BatchEncoding
            out = out["input_ids"]
        ids = list(out)
        if ids and isinstance(ids[0], (list, tuple)):
            ids = list(ids[0])
        return [int(i) for i in ids]
    text = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
    return [int(i) for i in tokenizer.encode(text)]
