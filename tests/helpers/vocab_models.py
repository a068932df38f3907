"""Random-weight models of the architectures users quantize, at their real vocabularies and at a
size a CPU runs in seconds: transformers' own configs (Llama 3, Qwen 2 with tied embeddings,
Qwen 3 at Qwen 3.5's vocabulary, Gemma 3 with final-logit soft-capping), each saved with a
tokenizer of the full vocabulary so every engine loads the directory as it would a downloaded
one, and a corpus whose token ids cover the whole vocabulary (most of them above 65,535). The weights
are the configs' own initialisation (std 0.02), so predictions are near uniform and every target
lies within the base file's clamp (a random corpus is far less likely under a peaked random
model than under a uniform one, and targets below the clamp would make PPL(base) differ from
PPL(Q) for a model against itself).

Built once and cached beside the other generated models (kldtool's cache directory), under a
lock: tests and benchmarks share them.

    python tests/helpers/vocab_models.py [NAME ...]     # build (or find) and print their paths
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

# name: (transformers model_type, vocabulary, what is special about it)
SHAPES = {
    "llama3": ("llama", 128_256, {}),
    "qwen2": ("qwen2", 151_936, {"tie_word_embeddings": True}),
    "qwen3.5-vocab": ("qwen3", 248_320, {}),
    "gemma3": ("gemma3_text", 262_144, {"final_logit_softcapping": 30.0, "query_pre_attn_scalar": 64}),
}
SMALL = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=32768,
)
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2; every other id i is the word "w{i}"
CORPUS_WORDS = 40_000
VERSION = 3  # bump when what is built changes: the cache key


def cache_root() -> Path:
    from kldtool.engines.defaults import cache_dir

    return cache_dir() / f"vocab-models-v{VERSION}"


def model_dir(name: str) -> Path:
    """The model's directory (config, safetensors, tokenizer), built on first use."""
    target = cache_root() / name
    if (target / ".complete").exists():
        return target
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from conftest import machine_lock

    with machine_lock(cache_root() / f".{name}.lock"):
        if not (target / ".complete").exists():
            _build(name, target)
    return target


def corpus(name: str, ids: bool = False) -> Path:
    """CORPUS_WORDS ids drawn over the model's whole vocabulary, 50 to a line: as text (the words
    "w{id}", which the model's tokenizer maps back to the ids) or, with ``ids``, as the ids."""
    import numpy as np

    path = model_dir(name) / ("corpus.ids" if ids else "corpus.txt")
    if not path.exists():
        vocab = SHAPES[name][1]
        drawn = np.random.default_rng(vocab).integers(len(SPECIALS), vocab, CORPUS_WORDS)
        word = "{}" if ids else "w{}"
        lines = [" ".join(word.format(i) for i in drawn[k : k + 50]) for k in range(0, len(drawn), 50)]
        tmp = path.with_suffix(f".partial-{os.getpid()}")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, path)
    return path


def corpus_flags(name: str) -> list:
    """kldtool's flags for the model's corpus. transformers loads a qwen2 directory's tokenizer as
    its own Qwen2Tokenizer, a byte-level BPE rebuilt from the vocabulary and merges, which a
    word-level tokenizer has none of: that model reads the ids themselves (--corpus-format ids)."""
    if SHAPES[name][0] == "qwen2":
        return ["-f", corpus(name, ids=True), "--corpus-format", "ids"]
    return ["-f", corpus(name)]


def tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    words = {t: i for i, t in enumerate(SPECIALS)} | {f"w{i}": i for i in range(len(SPECIALS), vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _build(name: str, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, vocab, special = SHAPES[name]
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, **SMALL, **special
    )
    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    torch.manual_seed(vocab)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer(vocab).save_pretrained(tmp)
    (tmp / ".complete").write_text(json.dumps({"shape": name, "vocab": vocab}) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def llama_gguf(name: str = "llama3") -> Path:
    """The Llama-architecture model as an F16 GGUF written with the gguf package's writer (the
    tensor names and the rotary layout llama.cpp expects), its word-level vocabulary as a
    byte-level BPE whose merges build each word "w{id}" from its prefix (llama.cpp's byte-level
    pre-tokenizer keeps the space before a word, so its text tokenizes otherwise: give llama.cpp
    the ids, ``corpus(name, ids=True)``). Quantize it with `kldtool quantize`."""
    path = cache_root() / f"{name}-F16.gguf"
    if path.exists():
        return path
    import numpy as np
    import gguf
    from safetensors.numpy import load_file

    model_type, vocab, _ = SHAPES[name]
    if model_type != "llama":
        raise ValueError(f"{name}: only the llama architecture is written as a GGUF here")
    cfg = json.loads((model_dir(name) / "config.json").read_text())
    w = load_file(str(model_dir(name) / "model.safetensors"))
    heads, kv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]

    def rotary(t, n):  # transformers' rotate-half layout to llama.cpp's interleaved pairs
        return t.reshape(n, 2, t.shape[0] // n // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    tmp = path.with_suffix(f".partial-{os.getpid()}")
    out = gguf.GGUFWriter(str(tmp), "llama")
    out.add_context_length(cfg["max_position_embeddings"])
    out.add_embedding_length(dim)
    out.add_block_count(cfg["num_hidden_layers"])
    out.add_feed_forward_length(cfg["intermediate_size"])
    out.add_rope_dimension_count(dim // heads)
    out.add_head_count(heads)
    out.add_head_count_kv(kv)
    out.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    out.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"])
    out.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), vocab)]
    out.add_tokenizer_model("gpt2")
    out.add_tokenizer_pre("default")
    out.add_token_list(tokens)
    out.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (vocab - len(SPECIALS)))
    # "w1" and "w2" are no tokens (ids 1 and 2 are <s> and </s>) but lead to "w10".."w29999":
    # llama.cpp merges through symbols that are not in the vocabulary.
    out.add_token_merges(["w 1", "w 2"] + [f"{t[:-1]} {t[-1]}" for t in tokens[len(SPECIALS) :]])
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    out.add_add_bos_token(False)

    def f16(t):
        return t.astype(np.float16)

    out.add_tensor("token_embd.weight", f16(w["model.embed_tokens.weight"]))
    out.add_tensor("output_norm.weight", w["model.norm.weight"].astype(np.float32))
    out.add_tensor("output.weight", f16(w.get("lm_head.weight", w["model.embed_tokens.weight"])))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.add_tensor(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"].astype(np.float32))
        out.add_tensor(f"blk.{i}.attn_q.weight", f16(rotary(w[p + "self_attn.q_proj.weight"], heads)))
        out.add_tensor(f"blk.{i}.attn_k.weight", f16(rotary(w[p + "self_attn.k_proj.weight"], kv)))
        out.add_tensor(f"blk.{i}.attn_v.weight", f16(w[p + "self_attn.v_proj.weight"]))
        out.add_tensor(f"blk.{i}.attn_output.weight", f16(w[p + "self_attn.o_proj.weight"]))
        out.add_tensor(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"].astype(np.float32))
        out.add_tensor(f"blk.{i}.ffn_gate.weight", f16(w[p + "mlp.gate_proj.weight"]))
        out.add_tensor(f"blk.{i}.ffn_up.weight", f16(w[p + "mlp.up_proj.weight"]))
        out.add_tensor(f"blk.{i}.ffn_down.weight", f16(w[p + "mlp.down_proj.weight"]))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    for n in sys.argv[1:] or SHAPES:
        print(n, model_dir(n), corpus(n))
