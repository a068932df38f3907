"""Tokens as a server's legacy echo answer names them: by their text, not their id.

The text of a token is its bytes decoded as UTF-8; a token that is part of a character has no
whole text, and servers differ in what they print for it (llama-cpp-python drops the broken
bytes, others print U+FFFD). So a text names a token only where exactly one token of the
vocabulary prints that way under either rule; any other text names no id (-1), and what it
carries goes into the one bucket of everything unnamed (reduce/quant_topk.py).
"""

from __future__ import annotations

import re

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece's byte fallback


def token_bytes(tokenizer, n_vocab: int) -> list[bytes]:
    """Each id's bytes, as the model's detokenizer gives them alone (special tokens: none)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), n_vocab))))
    special = set(tokenizer.all_special_ids)
    byte_of = _byte_alphabet()
    in_alphabet = sum(1 for p in pieces if p and all(c in byte_of for c in p))
    byte_level = in_alphabet > 0.9 * len(pieces)  # GPT-2's byte alphabet, as Llama 3, Qwen, SmolLM use
    out = []
    for i, p in enumerate(pieces):
        if p is None or i in special:
            out.append(b"")
        elif byte_level and all(c in byte_of for c in p):
            out.append(bytes(byte_of[c] for c in p))
        elif m := _BYTE_TOKEN.match(p):
            out.append(bytes([int(m.group(1), 16)]))
        else:
            out.append(p.replace("\u2581", " ").encode("utf-8"))
    return out + [b""] * (n_vocab - len(out))


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character to byte: the printable bytes stand for themselves,
    every other byte for the next unused code point from 256 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out = {chr(b): b for b in kept}
    extra = 0
    for b in range(256):
        if b not in kept:
            out[chr(256 + extra)] = b
            extra += 1
    return out


class Pieces:
    """Token ids by the text a server prints for them, and the texts a window's tokens print."""

    def __init__(self, tokenizer, n_vocab: int):
        self.bytes = token_bytes(tokenizer, n_vocab)
        # special tokens print as nothing, or as their own name where a server shows them
        self.special = {i: tokenizer.convert_ids_to_tokens(i) for i in tokenizer.all_special_ids if i < n_vocab}
        seen: dict[str, int] = {}
        for i, raw in enumerate(self.bytes):
            for text in {raw.decode("utf-8", "ignore"), raw.decode("utf-8", "replace")}:
                seen[text] = -1 if text in seen and seen[text] != i else i
        self._id = seen

    def id_of(self, key: str) -> int:
        """The id a server's key names: ``token_id:N`` (vLLM's echo with
        return_tokens_as_token_ids), else a text only one token prints; -1 when none is sure."""
        if key.startswith("token_id:"):
            try:
                return int(key[9:])
            except ValueError:
                return -1
        return self._id.get(key, -1)

    def prints_as(self, token: int, key: str) -> bool:
        """Whether ``key`` is how a server may print ``token``."""
        if key.startswith("token_id:"):
            return key == f"token_id:{token}"
        raw = self.bytes[token]
        return key in (raw.decode("utf-8", "ignore"), raw.decode("utf-8", "replace"), self.special.get(token))

    def text(self, tokens) -> str:
        """The text of a run of tokens (a prompt a server tokenizes itself)."""
        return b"".join(self.bytes[int(t)] for t in tokens).decode("utf-8", "replace")
