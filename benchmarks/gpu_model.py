"""A Llama-shaped F16 GGUF with random weights and a real model's tokenizer, made where it is
measured: a lent GPU machine has no network and takes at most 64 MiB a call, so no real model
of a GPU's size reaches it, but a 2 MiB tokenizer does.

    python benchmarks/gpu_model.py vocab SRC.gguf .gpu/vocab.gguf       # here: the tokenizer alone
    python benchmarks/gpu_model.py make .gpu/vocab.gguf OUT.gguf [--shape 1.7b|tiny] [--seed 0]

``make`` writes SmolLM2-1.7B's shape by default (24 layers, 2,048 wide, 8,192 in the MLP, 32
heads, tied embeddings: 1.7 billion weights, 3.4 GB) with weights drawn N(0, 0.02²) (the tied embedding and head N(0, 0.1²)) and norms 1.
Its predictions mean nothing; its arithmetic is a real model's, which is what a speed ratio and
an identity of statistics between two tools running it need.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SHAPES = {  # layers, width, MLP width, heads, key-value heads
    "1.7b": (24, 2048, 8192, 32, 32),
    "tiny": (2, 128, 256, 4, 2),
}


def _tokenizer_fields(reader):
    """(key, value, type, sub-type) of every tokenizer.* field of a GGUF, as its reader gives them."""
    import gguf

    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), kind, sub))
    return out


def vocab(src: str, dst: str) -> None:
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, "llama")
    for key, value, kind, sub in _tokenizer_fields(reader):
        writer.add_key_value(key, value, kind, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make(vocab_gguf: str, dst: str, shape: str, seed: int) -> None:
    import gguf

    layers, width, mlp, heads, kv_heads = SHAPES[shape]
    fields = _tokenizer_fields(gguf.GGUFReader(vocab_gguf))
    n_vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    head = width // heads
    w = gguf.GGUFWriter(dst, "llama")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(width)
    w.add_feed_forward_length(mlp)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(130000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(head)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, kind, sub in fields:
        w.add_key_value(key, value, kind, sub_type=sub)
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    ones = np.ones(width, dtype=np.float32)
    # Tied, so also the head: wider than the rest, so that logits of the unit-RMS final state
    # spread as a trained model's do (std 0.1 x sqrt(width)), not near a uniform distribution.
    w.add_tensor("token_embd.weight", weight(n_vocab, width, 0.1))
    w.add_tensor("output_norm.weight", ones)
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        w.add_tensor(b + "attn_q.weight", weight(heads * head, width))
        w.add_tensor(b + "attn_k.weight", weight(kv_heads * head, width))
        w.add_tensor(b + "attn_v.weight", weight(kv_heads * head, width))
        w.add_tensor(b + "attn_output.weight", weight(width, heads * head))
        w.add_tensor(b + "ffn_norm.weight", ones)
        w.add_tensor(b + "ffn_gate.weight", weight(mlp, width))
        w.add_tensor(b + "ffn_up.weight", weight(mlp, width))
        w.add_tensor(b + "ffn_down.weight", weight(width, mlp))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    v = sub.add_parser("vocab", help="a GGUF holding only SRC's tokenizer")
    v.add_argument("src")
    v.add_argument("dst")
    m = sub.add_parser("make", help="a random-weight F16 model with VOCAB's tokenizer")
    m.add_argument("vocab")
    m.add_argument("dst")
    m.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    m.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t0 = time.perf_counter()
    if a.what == "vocab":
        vocab(a.src, a.dst)
    else:
        make(a.vocab, a.dst, a.shape, a.seed)
    print(f"gpu_model: wrote {a.dst} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
