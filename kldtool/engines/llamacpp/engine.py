"""llama.cpp engine through llama-cpp-python's C API (GGUF models).

The context and batches are laid out exactly as llama-perplexity lays them out (n_seq chunks
per decode as separate sequences, n_ctx = n_seq * chunk, n_batch 2048, n_ubatch 512, KV
cleared before each pass), so the logits - and hence the base-file codes - are bit-identical
to llama-perplexity's on the same build.

``contexts`` > 1 (compare's default with two threads or more) splits the threads among that
many contexts on the one loaded model, each decoding its own batches of chunks on its own
thread (lanes.py; the pieces of a batch a lane may take: pieces.py). A logit is computed by the
same kernels whichever thread count holds it, so the numbers stay llama-perplexity's; the lanes
gain what ggml's threads lose waiting for each other at every operation of a decode.
"""

from __future__ import annotations

import copy
import os

import numpy as np

from kldtool.engines.contract import Facts, whole_windows
from kldtool.engines.llamacpp import load as llamacpp_load
from kldtool.engines.llamacpp.attention import Attention
from kldtool.engines.llamacpp.backend import placement
from kldtool.engines.llamacpp.load import cpu_features, silence_llama_logs
from kldtool.engines.llamacpp.offload import Offload
from kldtool.engines.llamacpp.options import LlamaCppOptions
from kldtool.engines.llamacpp.sampling import Sampler
from kldtool.errors import EngineError, UsageError
from kldtool.text.protocols import Window


class LlamaCppEngine(Sampler):
    name = "llamacpp"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "LlamaCppEngine":
        from kldtool.engines import defaults

        if opts.dtype not in (None, "gguf"):
            raise UsageError(f"--dtype {opts.dtype}: the llamacpp engine runs the GGUF's own types; drop --dtype")
        if opts.device not in (None, "cpu"):
            raise UsageError(f"--device {opts.device}: the llamacpp engine places layers with -ngl, -sm, -mg, -ts")
        specific = opts.specific or LlamaCppOptions()
        return cls(
            opts.model or defaults.default_gguf(),
            threads=opts.threads,
            batch_tokens=opts.batch_tokens,
            contexts=specific.contexts,
            attention=specific.attention,
            offload=specific.offload,
        )

    def __init__(
        self,
        model: str,
        threads: int | None = None,
        batch_tokens: int = 2048,
        verbose: bool = False,
        contexts: int | None = None,
        attention: Attention = Attention(),
        offload: Offload = Offload(),
    ):
        try:
            import llama_cpp as lib
        except ImportError:
            raise EngineError("the llamacpp engine needs llama-cpp-python (pip install llama-cpp-python)") from None
        self.lib = lib
        if not verbose:
            silence_llama_logs(lib)
        lib.llama_backend_init()
        if not os.path.isfile(model):
            raise EngineError(f"{model}: no such GGUF file")
        self.model_path = model
        self.attention = attention
        self.threads = threads or os.cpu_count() or 1
        self.batch_tokens = batch_tokens
        self.model = llamacpp_load.placed(lib, model, offload)
        if not self.model:
            raise EngineError(f"{model}: llama.cpp could not load it (not a GGUF model, or an unsupported one)")
        self.placement = placement(lib, self.model, offload, cpu_features(lib))
        # Contexts side by side share the CPU's threads; a GPU runs one batch at a time anyway.
        self.contexts = contexts or (1 if self.placement.on_gpu else min(2, self.threads))
        self.header_note = self.placement.line()
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.bos_id = int(lib.llama_vocab_bos(self.vocab)) if lib.llama_vocab_get_add_bos(self.vocab) else None
        self.facts = Facts(
            name=self.name,
            n_vocab=self.n_vocab,
            bos_id=self.bos_id,
            prefix_id=next(
                (t for t in (int(lib.llama_vocab_bos(self.vocab)), int(lib.llama_vocab_eos(self.vocab))) if t >= 0),
                None,
            ),
            n_ctx_train=int(lib.llama_model_n_ctx_train(self.model)) or None,
            model=model,
            dtype="gguf",
            versions={"llama-cpp-python": lib.__version__},
            cpu_isa=self.placement.cpu_isa,
            backend=self.placement.name,
            kv_cache=self.attention.kv_cache or "f16",
            flash_attn=self.attention.flash_attn,
            details={"threads": self.threads, "contexts": self.contexts, **self.placement.describe()},
            recorded=("engine", "model", "source", "dtype", "kv_cache", "flash_attn", "versions", "cpu_isa"),
        )
        if lib.llama_vocab_get_add_eos(self.vocab):
            raise EngineError(f"{model}: the model asks for EOS after every text; llama-perplexity's protocol has none")
        self.n_ubatch = int(lib.llama_context_default_params().n_ubatch)
        self.ctx = None
        self.ctx_shape = None
        self._owns_model = True
        self._lane = False  # a lane's context is sized for the pieces it gets (lane_pieces)
        self._tap = None  # routing.py's, while routing is recorded

    def routing_shape(self):
        from kldtool.engines.llamacpp.routing import router_shape

        return router_shape(self.lib, self.model)

    def record_routing(self):
        # One window per decode (each routed row's position is then known); each lane's context
        # its own tap (_twin).
        from kldtool.engines.llamacpp.routing import LlamaRouterTap

        if self._tap is None:
            self._tap = LlamaRouterTap(self.lib, self.routing_shape())
            self._free_context()  # the next one is made with the tap's callback
        return self._tap

    def schedule(self, batches: list[list[Window]]):
        from kldtool.engines.llamacpp.lanes import LaneSchedule

        return LaneSchedule(self, batches)

    def lanes(self, n_groups: int) -> list["LlamaCppEngine"]:
        """Up to ``contexts`` engines sharing this one's model, each with its own context and
        a share of the threads (at least one each); just this engine where one context is all
        there is to use."""
        n = min(self.contexts, n_groups, self.threads)
        if n <= 1:
            return [self]
        return [self._twin(self.threads // n + (i < self.threads % n)) for i in range(n)]

    def lane_pieces(self, batch: list[Window]) -> list[list[Window]]:
        from kldtool.engines.llamacpp.pieces import lane_pieces

        return lane_pieces(batch, self.n_ubatch, self.batch_tokens)

    def prepare(self, windows: list[Window]) -> None:
        self._ensure_context(len(windows[0].tokens), len(windows))

    def set_threads(self, n: int) -> None:
        self.threads = n
        if self.ctx:
            self.lib.llama_set_n_threads(self.ctx, n, n)

    def _twin(self, threads: int) -> "LlamaCppEngine":
        twin = copy.copy(self)
        twin.threads, twin.contexts, twin.ctx, twin.ctx_shape, twin._owns_model = threads, 1, None, None, False
        twin._lane = True
        twin._tap = self._tap and self._tap.twin()
        return twin

    def _ensure_context(self, n_ctx: int, n_windows: int):
        n_seq = max(1, self.batch_tokens // n_ctx)
        if self._lane:  # its pieces, or a whole batch where none could be cut
            n_seq = min(n_seq, n_windows)
        if self.ctx_shape and self.ctx_shape[0] == n_ctx and self.ctx_shape[1] >= n_seq:
            return
        self._free_context()
        lib = self.lib
        cp = lib.llama_context_default_params()
        cp.n_ctx = n_seq * n_ctx
        cp.n_seq_max = n_seq
        cp.n_batch = min(self.batch_tokens, n_seq * n_ctx)
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.swa_full = False  # llama-perplexity's (common's) default
        self.attention.apply(cp, lib)
        self.placement.offload.apply(cp)
        if self._tap:
            cp.cb_eval = self._tap.callback
        self.ctx = lib.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise EngineError(f"{self.model_path}: llama.cpp could not create a context of {n_seq} x {n_ctx} tokens")
        self.n_batch = int(cp.n_batch)
        self.batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self.ctx_shape = (n_ctx, n_seq)

    def _free_context(self) -> None:
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
        self.ctx = None
        self.ctx_shape = None

    def close(self) -> None:
        self._free_context()
        if self.model and self._owns_model:
            self.lib.llama_model_free(self.model)
        self.model = None

    def tokenize(self, text: bytes) -> np.ndarray:
        # One pass where the text averages two bytes a token or more (English prose is ~4): a
        # full-size buffer (a token per byte at most) would cost four times the text's memory,
        # and counting first would tokenize everything twice. Too small a buffer only makes
        # llama.cpp say how many tokens it needs, for the second pass.
        lib = self.lib
        cap = len(text) // 2 + 8
        for _ in range(2):
            buf = (lib.llama_token * cap)()
            got = lib.llama_tokenize(self.vocab, text, len(text), buf, cap, True, False)
            if got >= 0:
                return np.frombuffer(buf, dtype=np.int32, count=got).copy()
            if -got > len(text) + 8:  # INT32_MIN: more tokens than an int32 counts
                break
            cap = -got
        raise EngineError(f"llama.cpp tokenization failed ({got})")

    def token_strings(self):
        text, vocab = self.lib.llama_vocab_get_text, self.vocab
        return [text(vocab, i) or b"" for i in range(self.n_vocab)]

    def windows_per_call(self, n_ctx: int) -> int:
        return max(1, self.batch_tokens // n_ctx)

    def _fill(self, items: list[tuple[int, int, int, bool]]) -> None:
        """Load (token, pos, seq, wants_logits) items into the batch."""
        b = self.batch
        n = len(items)
        arr = np.array(items, dtype=np.int64)
        np.ctypeslib.as_array(b.token, shape=(n,))[:] = arr[:, 0]
        np.ctypeslib.as_array(b.pos, shape=(n,))[:] = arr[:, 1]
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        np.ctypeslib.as_array(b.logits, shape=(n,))[:] = arr[:, 3]
        for i in range(n):
            b.seq_id[i][0] = int(arr[i, 2])
        b.n_tokens = n

    def _decode(self, items) -> np.ndarray | None:
        """Decode and return llama.cpp's own logits buffer (a view: valid until the next decode)."""
        self._fill(items)
        rc = self.lib.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise EngineError(f"{self.model_path}: llama_decode failed with code {rc}")
        if self._tap:
            self._tap.decoded(items)
        n_out = sum(1 for it in items if it[3])
        ptr = self.lib.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)) if n_out else None

    def logits(self, windows: list[Window]) -> list:
        n_ctx = len(windows[0].tokens)
        self._ensure_context(n_ctx, len(windows))
        if n_ctx > self.n_batch:  # the blocks are views of llama.cpp's buffer: keep copies
            parts: list[list] = [[] for _ in windows]
            for i, _, lg in self._long_blocks(windows):
                parts[i].append(lg.copy())
            return [np.concatenate(p) for p in parts]
        if self._tap:
            if len(windows) > 1:
                return [self.logits([w])[0].copy() for w in windows]
            self._tap.window = windows[0]
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        first = windows[0].first
        items = [(int(t), k, s, k >= first) for s, w in enumerate(windows) for k, t in enumerate(w.tokens)]
        out = self._decode(items)
        per = n_ctx - first
        return [out[s * per : s * per + w.n_scored] for s, w in enumerate(windows)]

    def logit_blocks(self, windows: list[Window]):
        n_ctx = len(windows[0].tokens)
        self._ensure_context(n_ctx, len(windows))
        if n_ctx > self.n_batch:
            yield from self._long_blocks(windows)
        else:
            yield from whole_windows(self.logits(windows))

    def _long_blocks(self, windows: list[Window]):
        """A window longer than a batch: one sequence, several decodes (llama-perplexity's
        num_batches > 1); each decode's logits are yielded as a view, valid until the next."""
        for s, w in enumerate(windows):
            self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
            if self._tap:
                self._tap.window = w
            done = 0
            for a in range(0, len(w.tokens), self.n_batch):
                items = [(int(w.tokens[k]), k, 0, k >= w.first) for k in range(a, min(a + self.n_batch, len(w.tokens)))]
                got = self._decode(items)
                if got is not None and done < w.n_scored:
                    rows = got[: w.n_scored - done]
                    yield s, done, rows
                    done += len(rows)

    def hidden_blocks(self, windows: list[Window], probe_rows=None):
        """The final norm's output (llama.cpp's embeddings with no pooling) beside the logits.
        With embeddings on, llama.cpp outputs every token of a batch, so each decode's scored
        rows are picked here; windows that fit a batch still go in together, as for logits."""
        import torch

        lib, n_ctx = self.lib, len(windows[0].tokens)
        self._ensure_context(n_ctx, len(windows))
        dim = int(lib.llama_model_n_embd(self.model))
        packed = n_ctx <= self.n_batch and not self._tap
        lib.llama_set_embeddings(self.ctx, True)
        try:
            for seqs in [list(range(len(windows)))] if packed else [[s] for s in range(len(windows))]:
                lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
                for a in range(0, n_ctx, self.n_batch):
                    b = min(a + self.n_batch, n_ctx)
                    items = [(int(windows[s].tokens[k]), k, j, True) for j, s in enumerate(seqs) for k in range(a, b)]
                    if self._tap:
                        self._tap.window = windows[seqs[0]]
                    logits = self._decode(items)
                    emb = np.ctypeslib.as_array(lib.llama_get_embeddings(self.ctx), shape=(len(items), dim))
                    for j, s in enumerate(seqs):
                        w = windows[s]
                        lo, hi = max(a, w.first), min(b, w.first + w.n_scored)
                        if lo < hi:
                            rows = slice(j * (b - a) + lo - a, j * (b - a) + hi - a)
                            yield s, lo - w.first, torch.from_numpy(emb[rows].copy()), logits[rows], None
        finally:
            lib.llama_set_embeddings(self.ctx, False)

    def output_head(self):
        from kldtool.logitsfile.ggml_head import gguf_head
        from kldtool.logitsfile.hidden import OutputHead

        head, dim = gguf_head(self.model_path), int(self.lib.llama_model_n_embd(self.model))
        if head["shape"][1] != dim:
            raise EngineError(
                f"{self.model_path}: its head {head['name']} takes {head['shape'][1]} inputs, the model's "
                f"final norm gives {dim}"
            )
        scaling = {"multiplier": head["multiplier"], "softcap": head["softcap"]}
        return OutputHead(weight=head["data"], ggml=head["type"], shape=head["shape"], **scaling)
