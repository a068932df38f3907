"""xLSTM language models from helibrunna runs (``-m RUN`` or ``-m RUN/checkpoint-N``), built with
NX-AI's ``xlstm`` package and scored through the python engine's interface.

Within the model's ``context_length`` a window runs through its parallel forward; a longer one
(xlstm's parallel forward refuses it) runs through its recurrent ``step``, token by token with
the state carried, in blocks of ``-b`` tokens, so a 16,384-token song needs no more memory
than a 1,024-token one. Both paths give the same logits to ~5e-6.

The sLSTM cell runs on xlstm's ``vanilla`` backend, plain torch on any device: the ``cuda``
backend compiles kernels with nvcc when the model is built. A checkpoint saved from the CUDA
backend stores its sLSTM tensors in that backend's internal layout; they are converted
through the package's own external layout (helibrunna's loader converts only the recurrent
kernel, which is enough for one head).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kldtool.engines.xlstm import helibrunna
from kldtool.engines.registry import entry
from kldtool.errors import CorpusError, EngineError, UsageError

MODEL_TYPE = "xLSTMLMModel"


class WordTokenizer:
    """helibrunna's whitespace tokenizer: whitespace-separated tokens looked up in its
    word-level vocabulary. An unknown token is an error, not [UNK]: a corpus written with
    another vocabulary must not score as if it fitted."""

    def __init__(self, vocab: dict[str, int], where: str):
        self.vocab, self.where = vocab, where

    def encode(self, text: str) -> list[int]:
        ids = []
        for line, part in enumerate(text.split("\n"), 1):
            for tok in part.split():
                i = self.vocab.get(tok)
                if i is None:
                    raise CorpusError(f"line {line}: token {tok!r} is not in the vocabulary of {self.where}")
                ids.append(i)
        return ids

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def read_tokenizer(run: Path) -> tuple[WordTokenizer, int | None]:
    """The run's tokenizer and its pad id (tokenizer_config.json's pad_token; helibrunna adds [PAD])."""
    path = run / "tokenizer.json"
    try:
        spec = json.loads(path.read_text())
        model = spec["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EngineError(f"{path}: not a tokenizers file ({e})") from None
    if model.get("type") != "WordLevel":
        raise EngineError(
            f"{path}: a {model.get('type')} tokenizer; the xlstm engine reads helibrunna's whitespace one"
        )
    vocab = dict(model["vocab"])
    for added in spec.get("added_tokens") or []:
        vocab.setdefault(added["content"], added["id"])
    pad = "[PAD]"
    cfg = run / "tokenizer_config.json"
    if cfg.is_file():
        try:
            value = json.loads(cfg.read_text()).get("pad_token", pad)
        except ValueError as e:
            raise EngineError(f"{cfg}: not JSON ({e})") from None
        pad = value.get("content") if isinstance(value, dict) else value
    return WordTokenizer(vocab, str(path)), vocab.get(pad) if pad else None


def _read_config(ckpt: helibrunna.Checkpoint) -> dict:
    from omegaconf import OmegaConf

    path = ckpt.path / "config.yaml"
    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:  # OmegaConf raises its own and yaml's errors
        raise EngineError(f"{path}: unreadable config ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict) or config.get("type", MODEL_TYPE) != MODEL_TYPE:
        raise EngineError(f"{path}: not an {MODEL_TYPE} config (the xlstm engine builds only that model type)")
    return config


def _slstm_backend(config: dict) -> str:
    return ((config.get("slstm_block") or {}).get("slstm") or {}).get("backend", "cuda")


def _from_cuda_layout(model, state: dict) -> dict:
    """sLSTM tensors saved by the CUDA backend, in the vanilla cell's internal layout: reshaped
    to the external layout as the CUDA cell defines it, then through the vanilla cell's own
    ext2int."""
    out = dict(state)
    for name, module in model.named_modules():
        if type(module).__name__ != "sLSTMCell_vanilla":
            continue
        c = module.config
        kernel, bias = f"{name}._recurrent_kernel_", f"{name}._bias_"
        if kernel in out:
            ext = out[kernel].reshape(c.num_heads, c.head_dim, c.num_gates, c.head_dim)
            out[kernel] = module._recurrent_kernel_ext2int(ext).contiguous()
        if bias in out:
            out[bias] = module._bias_ext2int(out[bias].reshape(c.num_heads, c.num_gates, c.head_dim)).contiguous()
    return out


class XlstmCheckpoint:
    """One checkpoint as the python engine's factory object: tokenizer, logits, step."""

    def __init__(self, run: Path, ckpt: helibrunna.Checkpoint, device: str = "cpu"):
        import torch
        from safetensors.torch import load_file

        try:
            from dacite import from_dict
            from xlstm.xlstm_lm_model import xLSTMLMModel, xLSTMLMModelConfig
        except ImportError as e:
            raise EngineError(f"the xlstm engine needs xlstm, dacite and omegaconf: pip install 'kldtool[xlstm]' ({e})")
        config = _read_config(ckpt)
        saved = _slstm_backend(config)
        if config.get("slstm_block"):
            config["slstm_block"].setdefault("slstm", {})["backend"] = "vanilla"
        try:
            model = xLSTMLMModel(from_dict(xLSTMLMModelConfig, config))
        except Exception as e:  # dacite's and xlstm's own checks
            raise EngineError(f"{ckpt.path / 'config.yaml'}: xlstm cannot build the model ({e})") from None
        weights = ckpt.path / "model.safetensors"
        if not weights.is_file():
            raise EngineError(f"{weights}: missing (the xlstm engine reads model.safetensors, not model.pth)")
        state = load_file(str(weights))
        if saved == "cuda":
            state = _from_cuda_layout(model, state)
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[1:2] or [str(e)]
            raise EngineError(f"{weights}: does not fit its config.yaml ({first[0].strip()})") from None
        self.model = model.eval().to(device)
        self.tokenizer, self.pad_id = read_tokenizer(run)
        if len(self.tokenizer.vocab) > model.config.vocab_size:
            raise EngineError(
                f"{run / 'tokenizer.json'}: {len(self.tokenizer.vocab)} tokens, more than the model's "
                f"vocab_size {model.config.vocab_size}"
            )
        self.max_parallel = int(model.config.context_length)
        self.name = f"{run.name}/{ckpt.name}"
        self.device = torch.device(device)

    def logits(self, ids):
        return self.model(ids.to(self.device))

    def step(self, ids, state):
        """Logits of a block of tokens from the recurrent state, one token at a time (xlstm's
        mLSTM step takes one)."""
        import torch

        ids = ids.to(self.device)
        out = []
        # One token's ops are too small to split: on a CPU, intra-op threads only spin, and beside
        # another busy process they slow the loop down (docs/benchmarks.md, xLSTM).
        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(1)
        try:
            for t in range(ids.shape[1]):
                lg, state = self.model.step(ids[:, t : t + 1], state)
                out.append(lg)
        finally:
            torch.set_num_threads(threads)
        return torch.cat(out, dim=1), state


# The python engine's, driving a helibrunna checkpoint as a factory's object (reached by name).
PythonEngine = entry("python").load()


class XlstmEngine(PythonEngine):
    name = "xlstm"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "XlstmEngine":
        if opts.model is None:
            raise UsageError("--engine xlstm needs -m RUN_DIR or -m RUN_DIR/checkpoint-N (a helibrunna run)")
        if opts.dtype not in (None, "float32"):
            raise UsageError(f"--dtype {opts.dtype}: the xlstm engine runs float32")
        return cls(opts.model, threads=opts.threads, batch_tokens=opts.batch_tokens, device=opts.device or "cpu")

    def __init__(self, model: str, threads: int | None = None, batch_tokens: int = 2048, device: str = "cpu"):
        if not helibrunna.looks_like(model):
            raise EngineError(f"{model}: not a helibrunna run (tokenizer.json and checkpoint-N/config.yaml)")
        self.run, self.checkpoint = helibrunna.split_model(model)
        obj = XlstmCheckpoint(self.run, self.checkpoint, device)
        super().__init__(str(self.checkpoint.path), threads, batch_tokens, obj=obj)

    def _facts(self):
        import xlstm

        facts = super()._facts()
        versions = dict(facts.versions) | {"xlstm": getattr(xlstm, "__version__", "?")}
        run = {"run": str(self.run), "checkpoint": self.checkpoint.name, "step": self.checkpoint.step}
        details = dict(facts.details) | run | {"context_length": self.obj.max_parallel}
        return replace(facts, dtype="float32", versions=versions, details=details)
