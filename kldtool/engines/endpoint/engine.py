"""The endpoint engine: a model served by any OpenAI-compatible server that returns prompt
log-probs (vLLM's ``prompt_logprobs``), with no kldtool on the server.

Each window is one completion request: its token ids as the prompt (followed by a rolling
window's last target, which lies past it), ``max_tokens=1`` and ``prompt_logprobs=K``. The
server answers, per position, the log-prob of the prompt's next token and its top K; the
records come from those against the base file's full rows here (reduce/quant_topk.py): PPL,
Δp and the same top exactly, KLD, reverse KLD and JSD as lower bounds.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.base import Engine
from kldtool.engines.endpoint.client import Client, HttpError
from kldtool.errors import EngineError, UsageError
from kldtool.protocols import Window

APIS = ("vllm",)  # request shapes; the legacy echo form and SGLang's are not built yet
DEFAULT_MAX_K = 256  # where a server allows any K: more costs bandwidth, and S's mass hardly grows
LOGPROB_SLACK = 1e-4  # a log-prob above 0 by more than float32 rounding is no log-prob
_MAX_ALLOWED = re.compile(r"max(?:imum)? allowed:? (\d+)", re.IGNORECASE)


class EndpointEngine(Engine):
    name = "endpoint"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "EndpointEngine":
        own = {"dtype": opts.dtype, "device": opts.device, "threads": opts.threads}
        named = [f"--{k}" for k, v in own.items() if v] + [f"--{k.replace('_', '-')}" for k in opts.vllm]
        if named:
            raise UsageError(f"{', '.join(named)}: the server's own settings, not kldtool's with --endpoint")
        return cls(opts.endpoint, opts.model, n_ctx, opts.endpoint_model, opts.top_k, opts.concurrency or 4)

    def __init__(
        self,
        url: str,
        tokenizer: str | None = None,
        n_ctx: int = 0,
        model: str | None = None,
        top_k: int | None = None,
        concurrency: int = 4,
    ):
        self.client = Client(url)
        self.url = self.client.url
        self.concurrency = concurrency
        listed = self.client.get("/v1/models").get("data")
        if not isinstance(listed, list) or not listed or not all(isinstance(m, dict) and "id" in m for m in listed):
            raise EngineError(f"{self.url}/v1/models: no model list (not an OpenAI-compatible server?)")
        by_id = {m["id"]: m for m in listed}
        if model is not None and model not in by_id:
            raise UsageError(f"--endpoint-model {model}: {self.url} serves {', '.join(sorted(by_id))}")
        entry = by_id[model] if model is not None else listed[0]
        self.model_id, self.models_answer = entry["id"], listed
        self.max_model_len = entry.get("max_model_len")
        if n_ctx and self.max_model_len and n_ctx + 1 > self.max_model_len:
            raise UsageError(
                f"-c {n_ctx}: {self.url} serves {self.model_id} with a context of {self.max_model_len}; "
                f"a window needs -c + 1 (its operator raises it with --max-model-len)"
            )
        loaded = hf_tokenizer.served_tokenizer(tokenizer, entry)
        self.tokenizer, self.tokenizer_path = loaded.tokenizer, loaded.path
        self.n_ctx_train, self.bos_id, self.prefix_id = loaded.n_ctx_train, loaded.bos_id, loaded.prefix_id
        if loaded.n_vocab is None:
            raise EngineError(f"{loaded.path}: its config names no vocabulary size")
        self.n_vocab = int(loaded.n_vocab)
        self.k = self._top_k(top_k)
        self.tails: list[dict] = []  # per block of scored positions: P_out and the TV interval

    def _top_k(self, asked: int | None) -> int:
        """``asked``, checked against the server; else the most the server allows."""
        probe = min(asked or 1 << 20, self.n_vocab)
        try:
            self._logprobs([0, 0], probe)
            return asked or min(probe, DEFAULT_MAX_K)
        except HttpError as e:
            m = _MAX_ALLOWED.search(e.message)
            if e.status != 400 or not m:
                raise
            most = int(m.group(1))
            if asked:
                raise UsageError(
                    f"--top-k {asked}: {self.url} returns at most {most} log-probs a position "
                    f"(vLLM: its operator raises it with --max-logprobs)"
                ) from None
            return most

    def _logprobs(self, prompt: list[int], k: int) -> list:
        body = {
            "model": self.model_id,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": k,
        }
        answer = self.client.post("/v1/completions", body)
        try:
            rows = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise EngineError(
                f"{self.url}: the answer has no prompt_logprobs (--endpoint asks in vLLM's form; this server does not answer it)"
            ) from None
        if not isinstance(rows, list) or len(rows) != len(prompt):
            got = len(rows) if isinstance(rows, list) else "none"
            raise EngineError(f"{self.url}: {got} prompt log-probs for a prompt of {len(prompt)} tokens (truncated?)")
        return rows

    def window_logprobs(self, w: Window, k: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(top-``k`` ids, their log-probs, the target's log-prob) at each scored position of
        ``w``; ``k`` defaults to the run's K (0: the targets' log-probs alone)."""
        k = self.k if k is None else k
        prompt = [int(t) for t in w.tokens]
        end = w.first + w.n_scored
        if end == len(prompt):  # a rolling window scores its last position: the target follows it
            prompt.append(int(w.targets[-1]))
        rows = self._logprobs(prompt, k)
        ids = np.zeros((w.n_scored, k), np.int64)
        lps = np.zeros((w.n_scored, k), np.float64)
        target = np.zeros(w.n_scored, np.float64)
        for j, pos in enumerate(range(w.first + 1, end + 1)):
            row = rows[pos]
            want = prompt[pos]
            try:
                entries = {int(t): float(v["logprob"]) for t, v in row.items()}
                ranked = sorted(((v["rank"], int(t)) for t, v in row.items() if v["rank"] <= k))
            except (AttributeError, KeyError, TypeError, ValueError):
                raise EngineError(f"{self.url}: window {w.index}, position {pos}: not a log-prob entry") from None
            if want not in entries or len(ranked) < k:
                raise EngineError(
                    f"{self.url}: window {w.index}, position {pos}: the answer lacks the prompt's token "
                    f"{want} or holds fewer than {k} top log-probs"
                )
            top = [t for _, t in ranked[:k]]
            ids[j], lps[j], target[j] = top, [entries[t] for t in top], entries[want]
        # A server's numbers are checked like any other input: log-probs, of ids the model has.
        if (
            np.isnan(lps).any()
            or np.isnan(target).any()
            or (lps > LOGPROB_SLACK).any()
            or (target > LOGPROB_SLACK).any()
        ):
            raise EngineError(f"{self.url}: window {w.index}: the answer holds values that are not log-probs")
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise EngineError(f"{self.url}: window {w.index}: the answer names token ids outside the vocabulary")
        return ids, lps, target

    # --- the Engine interface --------------------------------------------------------------

    def tokenize(self, text: bytes) -> np.ndarray:
        return hf_tokenizer.tokenize(self.tokenizer, text, self.bos_id)

    def token_strings(self):
        return hf_tokenizer.token_strings(self.tokenizer, self.n_vocab)

    def windows_per_call(self, n_ctx: int) -> int:
        return max(self.concurrency, 1)

    def logits(self, windows: list[Window]) -> list:
        raise EngineError("--endpoint: compare and ppl only (a server returns log-probs, not logits)")

    def nll(self, windows: list[Window]) -> list[np.ndarray]:
        """Each scored target's NLL, from the server's log-prob of the prompt's own token."""
        with ThreadPoolExecutor(max_workers=min(len(windows), self.concurrency) or 1) as pool:
            answers = pool.map(lambda w: self.window_logprobs(w, 0), windows)
            return [(-target).astype(np.float32) for _, _, target in answers]

    def score(self, windows: list[Window], source) -> list:
        from kldtool.reduce.quant_topk import reduce_quant_topk
        from kldtool.reduce.records import TokenRecords

        with ThreadPoolExecutor(max_workers=min(len(windows), self.concurrency) or 1) as pool:
            answers = list(pool.map(self.window_logprobs, windows))
        out = []
        for w, (ids, lps, target) in zip(windows, answers):
            parts, a = [], 0
            for rows in source.parts_numpy(w.index, 0, w.n_scored):
                b = a + len(rows)
                rec, tail = reduce_quant_topk(
                    rows, self.n_vocab, source.header.kld_floor, ids[a:b], lps[a:b], target[a:b], w.targets[a:b]
                )
                parts.append(rec)
                self.tails.append(tail)
                a = b
            out.append(TokenRecords.concat(parts))
        return out

    def bounded(self) -> dict:
        """What a run of this engine knows only as a bound, and how much the top K leave unknown."""
        cat = {
            k: np.concatenate([t[k] for t in self.tails]) if self.tails else np.zeros(0)
            for k in ("p_out", "tv_lo", "tv_hi")
        }
        p, lo, hi = cat["p_out"], cat["tv_lo"], cat["tv_hi"]
        return {
            "top_k": self.k,
            "api": "vllm",
            "exact": ["ppl", "ln_ppl_ratio", "dp", "rms_dp", "same_top_p", "ptop_base"]
            + (["top5", "top10"] if self.k >= 10 else (["top5"] if self.k >= 5 else [])),
            "lower_bounds": ["kld", "rkld", "jsd"],
            "p_out_mean": float(p.mean()) if p.size else None,
            "p_out_99": float(np.quantile(p, 0.99)) if p.size else None,
            # the mean of per-position intervals is an interval for the mean
            "tv_mean": [float(lo.mean()), float(hi.mean())] if p.size else None,
            "acceptance": [float(1 - hi.mean()), float(1 - lo.mean())] if p.size else None,
            "retries": self.client.retried,
        }

    def describe(self) -> dict:
        return {
            "engine": self.name,
            "model": self.model_id,
            "server": self.url,
            "device": "server",
            "tokenizer": self.tokenizer_path,
            "top_k": self.k,
            "endpoint_api": "vllm",
            "models_answer": self.models_answer,
        }
