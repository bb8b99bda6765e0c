"""The end-to-end reader: the whole embedded model generating greedily from a compressed prompt, and
the generation budget of a RULER sample."""

from __future__ import annotations

from pathlib import Path

import torch

from ...models.device import Placement
from ..tasks.ruler import RulerSample


def new_token_budget(sample: RulerSample, cap: int, tokenizer) -> int:
    """RULER's tokens_to_generate, cut to `cap` (0 = no cap) to save CPU time, but never below what
    the gold answers themselves take (their tokens + 2 each for separators + 8): a cap may trim the
    chatter after an answer, never the answer (a UUID alone is ~33 tokens)."""
    if not cap:
        return sample.tokens_to_generate
    need = sum(len(tokenizer(" " + a, add_special_tokens=False).input_ids) + 2 for a in sample.answers) + 8
    return min(sample.tokens_to_generate, max(cap, need))


class Generator:
    """The whole embedded model (all layers, transformers) for the end-to-end metric."""

    def __init__(self, checkpoint: Path, tokenizer, chat: bool, placement: Placement):
        from transformers import AutoModelForCausalLM

        dtype = torch.float32 if placement.device.type == "cpu" else placement.dtype
        self.device = placement.device
        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype).to(self.device).eval()
        self.tokenizer = tokenizer
        self.head: list[int] = []
        self.tail: list[int] = []
        if chat and tokenizer.chat_template:
            marker = "\u2063"  # split the rendered template around the user's content
            text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                                 add_generation_prompt=True)
            head, tail = text.split(marker)
            self.head = tokenizer(head, add_special_tokens=False).input_ids
            self.tail = tokenizer(tail, add_special_tokens=False).input_ids
        stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        self.stops = [s for s in stops if isinstance(s, int) and s >= 0]

    def prompt(self, kept_ids: list[int], sample: RulerSample) -> list[int]:
        """[chat head] + kept context + question + [chat tail] + answer prefix (RULER's layout)."""
        tok = self.tokenizer
        question = tok(sample.question, add_special_tokens=False).input_ids
        prefix = tok(sample.answer_prefix.strip() if self.tail else sample.answer_prefix, add_special_tokens=False).input_ids
        return self.head + kept_ids + question + self.tail + prefix

    def generate(self, ids: list[int], max_new_tokens: int) -> str:
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids], device=self.device),
                                      attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=self.device),
                                      max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.stops,
                                      pad_token_id=self.stops[0])
        return self.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
