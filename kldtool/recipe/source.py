"""The source GGUF as the engine the costs are measured on: transformers' dequantization of its
weights, and of its tokenizer only what the stored windows need, the BOS llama.cpp puts first
(the GGUF's own metadata). The windows are the base file's tokens, so no text is tokenized, and
a GGUF whose vocabulary transformers cannot rebuild as a tokenizer still works."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufSpecials:
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos: bool

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        first = [self.bos_token_id] if add_special_tokens and self.add_bos and self.bos_token_id is not None else []
        return {"input_ids": first + [0]}


def specials(path: str) -> GgufSpecials:
    from gguf import GGUFReader

    fields = GGUFReader(path).fields

    def value(key):
        f = fields.get(key)
        return None if f is None else f.parts[-1][0].item()

    add = value("tokenizer.ggml.add_bos_token")
    return GgufSpecials(value("tokenizer.ggml.bos_token_id"), value("tokenizer.ggml.eos_token_id"), bool(add))


def source_engine(path: str, dtype: str, device: str):
    from kldtool.attribute.units import load_quant
    from kldtool.engines.registry import entry

    model = load_quant(path, dtype).to(device)
    return entry("transformers").load().from_model(model, specials(path), path, device=device)
