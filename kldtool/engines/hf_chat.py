"""The chat side of ``kldtool generate`` (contract.py's Sampler) for every engine whose tokenizer
is a Hugging Face tokenizer (transformers, vLLM offline and served): the tokenizer's own chat
template rendered by kldtool's renderer (text/chat.py), and the rendered text's ids as the
tokenizer parses it, special tokens written in the text included and none added."""

from __future__ import annotations

import numpy as np

from kldtool.text.chat import ChatTemplate


class HfChat:
    """A base class of the engines above; they set ``tokenizer`` and ``facts``."""

    def chat_template(self) -> ChatTemplate | None:
        source = getattr(self.tokenizer, "chat_template", None)
        if not isinstance(source, str) or not source.strip():
            return None
        special = {k: v for k, v in self.tokenizer.special_tokens_map.items() if isinstance(v, str)}
        return ChatTemplate(source, special, f"{self.facts.model}'s chat template")

    def tokenize_rendered(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
