"""A small byte-level BPE tokenizer with a ChatML chat template, built locally in about a second.

Tests and tiny models need a real `transformers` tokenizer without a model hub. This one:

- is byte-level BPE (GPT-2/Qwen style), so *any* text round-trips through encode/decode;
- splits digits one per token (Qwen2 does the same), so ``123`` is ``1 2 3`` and arithmetic
  answers are read digit by digit;
- is trained on printable ASCII plus a sample of the synthetic arithmetic prompts and ChatML
  scaffolding, so those texts compress to few tokens;
- has the special tokens ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos, as in
  Qwen2.5-Instruct, so generation stops at the end of the assistant turn);
- renders chats as ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
  ``<|im_start|>assistant\\n`` when ``add_generation_prompt=True``.

    from trainer.data.tiny_tokenizer import build_tiny_tokenizer
    tok = build_tiny_tokenizer()          # len(tok) == 297: the corpus yields fewer merges than the cap
    tok.apply_chat_template([{"role": "user", "content": "What is 3 + 5?"}], add_generation_prompt=True)

Training is deterministic, so two builds give identical vocabularies. `vocab_size` is a cap;
use ``len(tok)`` as the model's vocabulary size. Padding is on the left, as batched
generation with decoder-only models needs.
"""

from __future__ import annotations

import functools
import string

from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _training_corpus() -> list[str]:
    """ASCII, chat scaffolding and a few hundred synthetic prompts/answers of every difficulty."""
    from trainer.data.splits import DIFFICULTIES
    from trainer.data.synthetic import make_arithmetic_rows

    texts = [string.printable, "system\nuser\nassistant\n", "Answer: ", "The answer is "]
    for difficulty in DIFFICULTIES:
        for row in make_arithmetic_rows(200, difficulty=difficulty, seed=1234):
            question = row["prompt"][0]["content"]
            answer = row["reward_model"]["ground_truth"]
            texts.append(f"user\n{question}\nassistant\n{answer}\nAnswer: {answer}")
    return texts


@functools.lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A fresh `PreTrainedTokenizerFast` (byte-level BPE, ChatML template, pad/eos set).

    `vocab_size` must leave room for the 256 byte symbols and 3 special tokens.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (256 bytes + specials), got {vocab_size}")
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(_tokenizer_json(vocab_size))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok
