"""Hugging Face transformers engine: the reference implementation, CPU or CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.contract import Facts, carried_blocks, whole_windows
from kldtool.engines.transformers.sampling import Sampler
from kldtool.errors import EngineError, UsageError
from kldtool.text.protocols import Window

DTYPES = ("float32", "bfloat16", "float16", "float64")  # float64: reference runs


class TransformersEngine(Sampler):
    name = "transformers"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "TransformersEngine":
        from kldtool.engines import defaults

        return cls(
            opts.model or defaults.default_transformers_model(),
            dtype=opts.dtype or "float32",
            device=opts.device or "cpu",
            threads=opts.threads,
            batch_tokens=opts.batch_tokens,
        )

    def __init__(
        self,
        model: str,
        dtype: str = "float32",
        device: str = "cpu",
        threads: int | None = None,
        batch_tokens: int = 2048,
    ):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from kldtool.engines.hf_gguf import gguf_loading

        transformers.utils.logging.disable_progress_bar()
        if dtype not in DTYPES:
            raise UsageError(f"--dtype {dtype!r}: the transformers engine takes {', '.join(DTYPES)}")
        if threads:
            torch.set_num_threads(threads)
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineError(f"--device {device}: this torch build sees no CUDA device")
        self.model_path, self.dtype, self.device = model, dtype, device
        self.batch_tokens = batch_tokens
        path = Path(model)
        kwargs = {}
        if path.suffix == ".gguf":
            if not path.is_file():
                raise EngineError(f"{model}: no such GGUF file")
            kwargs["gguf_file"] = path.name
            source = str(path.parent)
        else:
            source = model
            if not path.exists() and os.sep in model:
                raise EngineError(f"{model}: no such model directory")
        try:
            with gguf_loading():
                self.tokenizer = _tokenizer(AutoTokenizer, source, kwargs, model)
                self.model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype), **kwargs)
            self.model.to(device).eval()
        except (OSError, ValueError) as e:
            raise EngineError(f"{model}: transformers could not load it: {str(e).splitlines()[0]}") from None
        self._loaded()

    @classmethod
    def from_model(cls, model, tokenizer, name: str, device: str = "cpu", batch_tokens: int = 2048):
        """An engine over a model already in memory on ``device`` (a benchmark's random weights
        made on the GPU, a notebook's model); ``name`` stands for its path in outputs."""
        self = cls.__new__(cls)
        self.model_path, self.dtype, self.device = name, str(model.dtype).removeprefix("torch."), device
        self.batch_tokens, self.tokenizer, self.model = batch_tokens, tokenizer, model.eval()
        self._loaded()
        return self

    def _loaded(self) -> None:
        import torch
        import transformers

        self.n_vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.bos_id = hf_tokenizer.bos_to_substitute(self.tokenizer)
        self._versions = {"transformers": transformers.__version__, "torch": torch.__version__}
        self._tap = None
        self.facts = Facts(
            name=self.name,
            n_vocab=self.n_vocab,
            bos_id=self.bos_id,
            prefix_id=hf_tokenizer.prefix_token(self.tokenizer),
            n_ctx_train=getattr(self.model.config, "max_position_embeddings", None),
            model=self.model_path,
            dtype=self.dtype,
            device=self.device,
            versions=self._versions,
        )

    def routing_shape(self):
        from kldtool.engines.transformers.routing import router_shape

        return router_shape(self.model)

    def record_routing(self):
        from kldtool.engines.transformers.routing import RouterTap

        self._tap = self._tap or RouterTap(self.model, self.routing_shape())
        return self._tap

    def tokenize(self, text: bytes) -> np.ndarray:
        return hf_tokenizer.tokenize(self.tokenizer, text, self.bos_id)

    def token_strings(self):
        return hf_tokenizer.token_strings(self.tokenizer, self.n_vocab)

    def windows_per_call(self, n_ctx: int) -> int:
        return max(1, self.batch_tokens // n_ctx)

    def logits(self, windows: list[Window]) -> list:
        import torch

        ids = torch.from_numpy(np.stack([w.tokens for w in windows]).astype(np.int64)).to(self.device)
        first, n_scored = windows[0].first, windows[0].n_scored
        keep = ids.shape[1] - first
        with torch.inference_mode():
            out = self.model(input_ids=ids, logits_to_keep=keep, use_cache=False)
        # In the model's dtype: the reducers and the encoder read it as float32 themselves, so a
        # bf16 model on a GPU does not pay a float32 copy of the batch's logits.
        lg = out.logits[:, :n_scored, :]
        if self._tap:
            self._tap.keep([w.index for w in windows], first, n_scored)
        return [lg[i] for i in range(len(windows))]

    def logit_blocks(self, windows: list[Window]):
        w = windows[0]
        if len(windows) > 1 or len(w.tokens) <= self.batch_tokens:
            yield from whole_windows(self.logits(windows))
            return
        # A window longer than a batch: blocks of batch_tokens through a KV cache, so memory
        # is O(block x vocab) for the logits (the cache itself is O(window x layers)).
        import torch
        from transformers import DynamicCache

        ids = torch.from_numpy(w.tokens.astype(np.int64))[None].to(self.device)
        cache = DynamicCache()
        with torch.inference_mode():
            for a, b, lo in carried_blocks(w, self.batch_tokens):
                out = self.model(
                    input_ids=ids[:, a:b], past_key_values=cache, use_cache=True, logits_to_keep=max(b - lo, 1)
                )
                if lo < b:
                    if self._tap:
                        self._tap.keep([w.index], lo - a, b - lo)
                    yield 0, lo - w.first, out.logits[0]
                del out

    def hidden_blocks(self, windows: list[Window], probe_rows=None):
        # The output head's input, caught on its way in: the same forward, no second one. Its
        # rows line up with the logits (the model slices both with logits_to_keep).
        caught = []
        hook = self.model.get_output_embeddings().register_forward_hook(lambda m, inp, out: caught.append(inp[0]))
        try:
            for i, off, lg in self.logit_blocks(windows):
                del caught[:-1]  # only the forward that made these logits
                yield i, off, caught[-1][i, : len(lg)], lg, None
        finally:
            hook.remove()

    def output_head(self):
        from kldtool.logitsfile.head_source import head_transforms
        from kldtool.logitsfile.hidden import OutputHead

        lm = self.model.get_output_embeddings()
        multiplier, softcap = head_transforms(self.model.config)
        bias = None if lm.bias is None else lm.bias.detach().cpu()
        return OutputHead(weight=lm.weight.detach().cpu(), bias=bias, multiplier=multiplier, softcap=softcap)

    def close(self) -> None:
        pass  # the model is freed with the engine


def _tokenizer(auto, source: str, kwargs: dict, model: str):
    """The model's tokenizer; the tokenizers library's own failures (a GGUF vocabulary it cannot
    rebuild raises a bare Exception) become one line."""
    try:
        return auto.from_pretrained(source, **kwargs)
    except (OSError, ValueError):
        raise
    except Exception as e:  # noqa: BLE001 - the Rust library raises Exception itself
        raise EngineError(f"{model}: transformers could not build its tokenizer: {str(e).splitlines()[0]}") from None
