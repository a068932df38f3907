"""A custom model for ``--engine python``: a small recurrent (GRU) byte-level language model
that transformers knows nothing about, with fixed random weights, and a "quantized" twin
whose weights are rounded to a 4-bit grid per output row.

    kldtool ppl --engine python --model tests/helpers/tiny_lm.py:make_base
"""

import torch

VOCAB = 256


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def get_vocab(self) -> dict[str, int]:
        return {f"<0x{i:02X}>": i for i in range(VOCAB)}


class TinyRecurrentLM(torch.nn.Module):
    def __init__(self, seed: int = 0, hidden: int = 64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.rnn = torch.nn.GRU(hidden, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, VOCAB)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / p.shape[-1] ** 0.5))
        self.tokenizer = ByteTokenizer()
        self.name = "tiny-gru"
        self.logit_multiplier = 4.0  # what step() does to the head's output, for --store hidden

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.step(ids, None)[0]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """kldtool's hidden-state API: the head's input (``self.head`` is the output head)."""
        return self.rnn(self.embed(ids))[0]

    def step(self, ids: torch.Tensor, state):
        """kldtool's step API: a block of a window, carrying the GRU's hidden state, so a
        document of any length runs in blocks at constant memory."""
        h, state = self.rnn(self.embed(ids), state)
        return self.head(h) * 4.0, state  # sharper than uniform, as a trained model is


def quantize_rows(w: torch.Tensor, bits: int = 4) -> torch.Tensor:
    scale = w.abs().amax(dim=-1, keepdim=True) / (2 ** (bits - 1) - 1)
    return torch.round(w / scale) * scale


def make_base() -> TinyRecurrentLM:
    return TinyRecurrentLM().eval()


def make_quant() -> TinyRecurrentLM:
    m = TinyRecurrentLM()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and not name.startswith("embed"):
                p.copy_(quantize_rows(p))
    m.name = "tiny-gru-q4"
    return m.eval()
