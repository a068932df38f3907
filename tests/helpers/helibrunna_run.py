"""A helibrunna training run of a small random xLSTM, and a REMIGEN2-like song corpus, built
on disk for tests and benchmarks (no download, no training).

The layout is what helibrunna's trainer leaves (read from its public source, not copied):
the run directory holds ``tokenizer.json`` (a whitespace word-level tokenizer saved by
``PreTrainedTokenizerFast.save_pretrained``, with ``[PAD]`` as its pad token), ``config.yaml``
(the whole training config) and ``history.json`` (``loss``, ``lr``, ``epoch`` and ``step``
lists, one entry per logged step); every ``checkpoint-N/`` (the last ``checkpoint-N-last/``)
holds ``config.yaml`` (the model part, which helibrunna builds ``xLSTMLMModel`` from) and
``model.safetensors``. The checkpoints are written as a GPU run writes them: the sLSTM cell in
the CUDA backend's internal layout and the config naming that backend.

``reference_models(run)`` gives each checkpoint's model as the generator built it (vanilla
backend, vanilla layout), for references that must not go through kldtool's loader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

SPECIALS = ["[UNK]", "[PAD]", "[EOS]"]
PAD = "[PAD]"
# REMIGEN2's token families: time signature, position, tempo, instrument, pitch, duration,
# velocity, and the bar line.
FAMILIES = {"s": 10, "o": 48, "t": 49, "i": 16, "p": 128, "d": 48, "v": 32}
STEPS = (20000, 40000, 80000, 120000, 158760)  # the last is saved as checkpoint-158760-last
LOG_EVERY = 100  # 158760 is not a logged step: its loss is the nearest one's


def vocabulary() -> list[str]:
    return SPECIALS + [f"{k}-{i}" for k, n in FAMILIES.items() for i in range(n)] + ["b-1"]


def model_config(vocab_size: int, context: int = 256, dim: int = 64, blocks: int = 4) -> dict:
    """The evaluated model's structure (mLSTM blocks with sLSTM mixed in, several heads), scaled
    down; ``backend`` is what a CUDA training run records."""
    return {
        "num_blocks": blocks,
        "embedding_dim": dim,
        "vocab_size": vocab_size,
        "context_length": context,
        "slstm_at": [1, 3] if blocks > 3 else [1],
        "mlstm_block": {"mlstm": {"num_heads": 4, "conv1d_kernel_size": 4, "qkv_proj_blocksize": 4}},
        "slstm_block": {"slstm": {"num_heads": 4, "backend": "cuda", "conv1d_kernel_size": 4}},
    }


def build_model(config: dict):
    from dacite import from_dict
    from xlstm.xlstm_lm_model import xLSTMLMModel, xLSTMLMModelConfig

    cfg = json.loads(json.dumps(config))
    cfg["slstm_block"]["slstm"]["backend"] = "vanilla"  # the backend that runs on a CPU
    model = xLSTMLMModel(from_dict(xLSTMLMModelConfig, cfg))
    model.reset_parameters()
    return model.eval()


def _checkpoint_weights(seed: int, steps: tuple[int, ...], config: dict) -> dict[int, dict]:
    """State dicts (vanilla layout) that move from noise toward the final weights over training."""
    torch.manual_seed(seed)
    final = build_model(config).state_dict()
    g = torch.Generator().manual_seed(seed + 1)
    noise = {k: torch.randn(v.shape, generator=g) * (v.std() if v.numel() > 1 else 0.1) for k, v in final.items()}
    out = {}
    for s in steps:
        left = 1.0 - s / steps[-1]
        out[s] = {k: v + 1.5 * left * noise[k] for k, v in final.items()}
    return out


def _to_cuda_layout(state: dict, config: dict) -> dict:
    """The vanilla cell's internal sLSTM tensors as the CUDA cell stores them: the recurrent
    kernel (heads, gates*dh, dh) -> (heads, dh, gates*dh), the bias (gates, heads, dh) -> (heads, gates, dh)."""
    heads = config["slstm_block"]["slstm"]["num_heads"]
    dh = config["embedding_dim"] // heads
    out = dict(state)
    for k, v in state.items():
        if k.endswith("slstm_cell._recurrent_kernel_"):
            out[k] = v.permute(0, 2, 1).contiguous()
        elif k.endswith("slstm_cell._bias_"):
            out[k] = v.reshape(4, heads, dh).permute(1, 0, 2).reshape(-1).contiguous()
    return out


def write_tokenizer(run: Path, vocab: list[str]) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"pad_token": PAD})
    fast.save_pretrained(str(run))


def write_history(run: Path, last: int) -> None:
    steps = list(range(LOG_EVERY, last + 1, LOG_EVERY))
    rng = np.random.default_rng(0)
    loss = [1.2 + 4.4 * math.exp(-s / 25000) + float(rng.normal(0, 0.02)) for s in steps]
    lr = [1e-3 * min(1.0, s / 2000) for s in steps]
    epoch = [20 * s / last for s in steps]
    (run / "history.json").write_text(json.dumps({"loss": loss, "lr": lr, "epoch": epoch, "step": steps}))


def make_run(run: Path, seed: int = 0, steps: tuple[int, ...] = STEPS, **shape) -> Path:
    """Write the run directory (idempotent: a finished run is kept)."""
    import yaml
    from safetensors.torch import save_file

    if (run / ".complete").exists():
        return run
    run.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    config = model_config(len(vocab), **shape)
    write_tokenizer(run, vocab)
    write_history(run, steps[-1])
    whole = {"training": {"model_name": "musicxlstm", "num_epochs": 20}, "model": config, "tokenizer": {}}
    whole["tokenizer"] = {"type": "whitespace", "fill_token": "[EOS]"}
    (run / "config.yaml").write_text(yaml.safe_dump(whole))
    for s, state in _checkpoint_weights(seed, steps, config).items():
        d = run / (f"checkpoint-{s}-last" if s == steps[-1] else f"checkpoint-{s}")
        d.mkdir(exist_ok=True)
        saved = json.loads(json.dumps(config))
        if s == steps[0]:  # a config that leaves the backend at xlstm's default (cuda), as most do
            del saved["slstm_block"]["slstm"]["backend"]
        (d / "config.yaml").write_text(yaml.safe_dump(saved))
        save_file(_to_cuda_layout(state, config), str(d / "model.safetensors"))
    (run / ".complete").write_text("")
    return run


def reference_models(seed: int = 0, steps: tuple[int, ...] = STEPS, **shape) -> dict:
    """step -> the checkpoint's model, built and loaded without helibrunna's layout or kldtool."""
    config = model_config(len(vocabulary()), **shape)
    out = {}
    for s, state in _checkpoint_weights(seed, steps, config).items():
        m = build_model(config)
        m.load_state_dict(state)
        out[s] = m
    return out


def song(rng: np.random.Generator, n: int, pad_tail: int = 0) -> list[str]:
    """``n`` tokens of REMIGEN2-like music: a header, then bars of notes (position, instrument,
    pitch, duration, velocity), each bar closed by ``b-1``; ``pad_tail`` of them [PAD]."""
    out = [f"s-{rng.integers(10)}", f"t-{rng.integers(49)}"]
    key = int(rng.integers(40, 80))
    while len(out) < n - pad_tail:
        for _ in range(int(rng.integers(2, 8))):
            out += [f"o-{rng.integers(48)}", f"i-{rng.integers(16)}", f"p-{key + rng.integers(-12, 13)}"]
            out += [f"d-{rng.integers(1, 48)}", f"v-{rng.integers(8, 32)}"]
        out.append("b-1")
    return out[: n - pad_tail] + [PAD] * pad_tail


def write_songs(path: Path, lengths: list[int], seed: int = 0, pad_every: int = 3) -> Path:
    """One song per line; every ``pad_every``-th song ends in a few [PAD] tokens. Its vocabulary,
    a token per line in id order, goes beside it (``NAME.vocab``)."""
    rng = np.random.default_rng(seed)
    lines = [
        " ".join(song(rng, n, 5 if i % pad_every == pad_every - 1 and n > 10 else 0)) for i, n in enumerate(lengths)
    ]
    path.write_text("\n".join(lines) + "\n")
    path.with_name(path.name + ".vocab").write_text("\n".join(vocabulary()) + "\n")
    return path


def corpus_lengths(count: int = 40, seed: int = 0) -> list[int]:
    """Song lengths log-uniform over 50-20,000 tokens, plus a one-token song (skipped by the
    evaluation) and one of exactly 20,000."""
    rng = np.random.default_rng(seed)
    return [1, 20000] + [int(x) for x in np.exp(rng.uniform(math.log(50), math.log(20000), count - 2))]
