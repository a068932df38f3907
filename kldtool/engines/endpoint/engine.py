"""The endpoint engine: a model served by any OpenAI-compatible server that returns prompt
log-probs, with no kldtool on the server.

Each window is one completion request in the server's form (engines/endpoint/forms.py): its
token ids as the prompt, or its text where the server takes only text (then the server's
tokens are checked against the window's), followed by a rolling window's last target, which
lies past it. The server answers, per position, the log-prob of the prompt's next token and its
top K; the records come from those against the base file's full rows here
(reduce/quant_topk.py): PPL, Δp and the same top exactly, KLD, reverse KLD and JSD as lower
bounds, total variation as an interval.
"""

from __future__ import annotations

import dataclasses

import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.contract import description
from kldtool.engines.endpoint.client import TIMEOUT_S, Client, HttpError
from kldtool.engines.endpoint.forms import APIS, SAMPLING_APIS, EchoForm, SglangForm, VllmForm
from kldtool.engines.endpoint.listing import Listed
from kldtool.engines.endpoint.options import EndpointOptions
from kldtool.engines.endpoint.pieces import Pieces
from kldtool.errors import AccessDenied, EngineError, UsageError
from kldtool.text.protocols import Window
from kldtool.reduce.statistics import STATISTICS

DEFAULT_MAX_K = 256  # where a server allows any K: more costs bandwidth, and S's mass hardly grows
_MAX_ALLOWED = re.compile(r"max(?:imum)? allowed:? (\d+)", re.IGNORECASE)
# A window whose server top-1 agrees with the base's next position this much more often than
# with its own position holds log-probs one position late (checked from this many positions on)
SHIFT_MARGIN, SHIFT_MIN = 0.25, 16


class EndpointEngine:
    """A Scorer (engines/contract.py): its records come from the server's top-K log-probs."""

    name = "endpoint"

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "EndpointEngine":
        if opts.specific is not None and opts.specific.sampling:
            from kldtool.engines.endpoint.sampler import EndpointSampler

            return EndpointSampler.from_options(opts, n_ctx)
        specific = dataclasses.asdict(opts.specific or EndpointOptions())  # every field but url is a keyword here
        specific.pop("sampling")
        if specific["api"] in SAMPLING_APIS:
            raise UsageError(
                f"--endpoint-api {specific['api']}: generate's; a run over a base file takes {', '.join(APIS)}"
            )
        return cls(specific.pop("url"), tokenizer=opts.model, n_ctx=n_ctx, **specific)

    def __init__(
        self,
        url: str,
        tokenizer: str | None = None,
        n_ctx: int = 0,
        model: str | None = None,
        top_k: int | None = None,
        concurrency: int = 4,
        api: str = "auto",
        timeout: float = TIMEOUT_S,
        follow_redirects: bool = False,
    ):
        self.client = Client(url, timeout=timeout, follow_redirects=follow_redirects)
        self.url = self.client.url
        self.ambiguous = 0  # positions whose top 10 held an entry no id was sure of (text keys)
        self.concurrency = concurrency
        self.served = served = Listed(self.client, model, tokenizer)
        entry, loaded = served.entry, served.loaded
        self.model_id = entry["id"]
        self.max_model_len = entry.get("max_model_len")
        if n_ctx and self.max_model_len and n_ctx + 1 > self.max_model_len:
            raise UsageError(
                f"-c {n_ctx}: {self.url} serves {self.model_id} with a context of {self.max_model_len}; "
                f"a window needs -c + 1 (its operator raises it with --max-model-len)"
            )
        self.tokenizer = loaded.tokenizer
        self.n_ctx_train, self.bos_id, self.prefix_id = loaded.n_ctx_train, loaded.bos_id, loaded.prefix_id
        self.n_vocab = int(loaded.n_vocab)
        self.pieces = Pieces(self.tokenizer, self.n_vocab)
        self.probe = [int(t) for t in self.tokenize(b"The probe of a server")]
        self.form = self._pick_form(api)
        self.text_keys = isinstance(self.form, EchoForm) and _text_keyed(self._probed)
        self.k = self._top_k(top_k)
        self.header_note = f" ({self.form.name}{', text prompts' if self.form.text else ''}, top {self.k})"
        details = {"top_k": self.k, "endpoint_api": self.form.name, "text_keys": self.text_keys}
        self.facts = self.served.facts(self.name, self.url, self.bos_id, **details)

    def _pick_form(self, api: str):
        """The form asked for, or the first the server answers (probed once, never retried: a
        refusal is an answer)."""
        probe = Client(self.url, timeout=self.client.timeout, retries=0, follow_redirects=self.client._http.follow)
        tried = []
        for form in [VllmForm(), SglangForm(), EchoForm(), EchoForm(text=True)]:
            if api != "auto" and form.name != api:
                continue
            body = form.body(self.model_id, self._prompt(self.probe, form), 1)
            try:
                answer = probe.post(form.path, body)
                form.read(answer, self.probe, 1, self.url, self.pieces)
                self._probed = answer
                if form.text:
                    self._take_servers_bos(answer)
                return form
            except AccessDenied:
                raise
            except EngineError as e:
                tried.append(f"{form.name}{' (text)' if form.text else ''}: {str(e)[:120]}")
        raise EngineError(
            f"{self.url}: no prompt log-probs in the form{'s' if api == 'auto' else ''} tried ({'; '.join(tried)})"
        )

    def _take_servers_bos(self, answer: dict) -> None:
        """A server that tokenizes text itself puts its own BOS first, or none: which, from the
        tokens it counts for the probe's text, and the windows follow it (a tokenizer loaded
        here may not know, as transformers' from a GGUF does not)."""
        ours = len(self.probe) - (1 if self.probe and self.probe[0] in self.pieces.special else 0)
        usage = answer.get("usage")  # a server's answer: a dict only where it says so
        counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if counted == ours + 1 and self.tokenizer.bos_token_id is not None:
            self.bos_id = self.tokenizer.bos_token_id
        elif counted == ours:
            self.bos_id = None

    def _prompt(self, tokens: list[int], form) -> list[int] | str:
        if not form.text:
            return tokens
        skip = 1 if tokens and tokens[0] in self.pieces.special else 0  # the server adds its own BOS
        return self.pieces.text(tokens[skip:])

    def _top_k(self, asked: int | None) -> int:
        """``asked``, checked against the server; else the most the server allows."""
        probe = min(asked or 1 << 20, self.n_vocab)
        if not asked and not isinstance(self.form, VllmForm):
            probe = min(DEFAULT_MAX_K, self.n_vocab)  # a server with no limit answers every entry
        try:
            self._logprobs(self.probe, probe, "the probe")
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

    def _logprobs(self, prompt: list[int], k: int, where: str) -> list:
        body = self.form.body(self.model_id, self._prompt(prompt, self.form), k)
        return self.form.read(self.client.post(self.form.path, body), prompt, k, f"{self.url}: {where}", self.pieces)

    def window_logprobs(self, w: Window, k: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(top-``k`` ids, -1 where not known by id; their log-probs; the target's log-prob) at
        each scored position of ``w``; ``k`` defaults to the run's K (0: the targets' alone)."""
        k = self.k if k is None else k
        prompt = [int(t) for t in w.tokens]
        end = w.first + w.n_scored
        if end == len(prompt):  # a rolling window scores its last position: the target follows it
            prompt.append(int(w.targets[-1]))
        where = f"window {w.index}"
        rows = self._logprobs(prompt, max(k, 1) if isinstance(self.form, EchoForm) else k, where)
        ids = np.full((w.n_scored, k), -1, np.int64)
        lps = np.zeros((w.n_scored, k), np.float64)  # an unknown entry: outside S whatever its value
        target = np.zeros(w.n_scored, np.float64)
        for j, pos in enumerate(range(w.first + 1, end + 1)):
            row = rows[pos]
            # text keys that several tokens print as leave an echo answer fewer entries: the
            # missing ones stay unknown (-1, their mass in the bucket)
            if row is None or (len(row.ranked) < k and not isinstance(self.form, EchoForm)):
                raise EngineError(
                    f"{self.url}: {where}, position {pos}: the answer holds fewer than {k} top log-probs there"
                )
            target[j] = row.own
            for i, (t, v) in enumerate(row.ranked[:k]):
                ids[j, i], lps[j, i] = t, v
            if any(t < 0 for t, _ in row.ranked[:10]):
                self.ambiguous += 1  # the same top and top-5/10 counted here are then lower bounds
        if (ids >= self.n_vocab).any():
            raise EngineError(f"{self.url}: {where}: the answer names token ids outside the vocabulary")
        return ids, lps, target

    # --- the Engine interface --------------------------------------------------------------

    def tokenize(self, text: bytes) -> np.ndarray:
        return hf_tokenizer.tokenize(self.tokenizer, text, self.bos_id)

    def token_strings(self):
        return hf_tokenizer.token_strings(self.tokenizer, self.n_vocab)

    def windows_per_call(self, n_ctx: int) -> int:
        return max(self.concurrency, 1)

    def rows_source(self, reader, chunks: list[int]):
        from kldtool.logitsfile.prefetch import PrefetchedChunks

        return PrefetchedChunks(reader, chunks, device="cpu")  # the records are reduced here, on the host

    def encode(self, windows: list[Window], coding):
        """``base --endpoint``: top-K records of the server's answers (its K ids, in its order)."""
        if not coding.keep or coding.keep > self.k:
            raise UsageError(
                f"base --endpoint writes top-K records, K at most the {self.k} log-probs {self.url} returns a "
                f"position: add --keep top-K"
            )
        return self._encoded(windows, coding)

    def _encoded(self, windows: list[Window], coding):
        from kldtool.engines.endpoint.base_records import topk_records

        with ThreadPoolExecutor(max_workers=min(len(windows), self.concurrency) or 1) as pool:
            answers = pool.map(lambda w: self.window_logprobs(w, coding.keep), windows)
            for i, (w, (ids, lps, target)) in enumerate(zip(windows, answers)):
                yield i, topk_records(ids, lps, target, w.targets, self.n_vocab, coding), (-target).astype(np.float32)

    def nll(self, windows: list[Window]) -> list[np.ndarray]:
        """Each scored target's NLL, from the server's log-prob of the prompt's own token."""
        with ThreadPoolExecutor(max_workers=min(len(windows), self.concurrency) or 1) as pool:
            answers = pool.map(lambda w: self.window_logprobs(w, 0), windows)
            return [(-target).astype(np.float32) for _, _, target in answers]

    def score(self, windows: list[Window], source) -> list:
        from kldtool.reduce.quant_topk import reduce_quant_topk, reduce_topk_both
        from kldtool.reduce.records import TokenRecords

        h = source.header
        reduce = (  # a top-K base file: two providers through one reference
            (lambda rows, *q: reduce_topk_both(rows, h.keep, h.clamped_at, *q))
            if h.keep
            else (lambda rows, *q: reduce_quant_topk(rows, self.n_vocab, h.clamped_at, *q))
        )

        with ThreadPoolExecutor(max_workers=min(len(windows), self.concurrency) or 1) as pool:
            answers = list(pool.map(self.window_logprobs, windows))
        out = []
        for w, (ids, lps, target) in zip(windows, answers):
            parts, a = [], 0
            for rows in source.parts_numpy(w.index, 0, w.n_scored):
                b = a + len(rows)
                parts.append(reduce(rows, ids[a:b], lps[a:b], target[a:b], w.targets[a:b]))
                a = b
            out.append(TokenRecords.concat(parts))
            self._check_alignment(w, out[-1])
        return out

    def _check_alignment(self, w: Window, rec) -> None:
        """Refuse log-probs one position late: a server whose top-1 at each token agrees with the
        base's top-1 at the next position far more often than at its own answers, at each token,
        for the token after it (llama-cpp-python's echo for a model without a BOS token)."""
        n = len(rec)
        if not isinstance(self.form, EchoForm) or n < SHIFT_MIN:
            return
        own = float(np.mean(rec.top1_q == rec.top1_base))
        late = float(np.mean(rec.top1_q[:-1] == rec.top1_base[1:]))
        if late > own + SHIFT_MARGIN:
            raise EngineError(
                f"{self.url}: window {w.index}: the server's echoed log-probs at each token are those of the "
                f"position after it (top-1 agreement {late:.0%} one position on, {own:.0%} in place; "
                f"llama-cpp-python's echo without a BOS token does this); kldtool does not realign them"
            )

    def bounded(self, resumed: bool = False) -> dict:
        """What a run of this engine knows exactly and only as a bound (P_out, the total
        variation's interval and the tail estimate come from the run's sums). A resumed run
        does not know what the sessions before it met: their ambiguity counts as unknown."""
        seen = None if resumed else self.ambiguous
        described = description(self.facts) | {"ambiguous_positions": seen}
        return bounded_facts(described) | {"retries": self.client.retried}

    def close(self) -> None:
        self.client.close()


def _text_keyed(answer) -> bool:
    """Whether an echo answer's top log-probs are keyed by text (llama-cpp-python), where an
    entry may name no sure id, rather than by ``token_id:N`` (vLLM)."""
    try:
        tops = answer["choices"][0]["logprobs"]["top_logprobs"]
        keys = [key for row in tops if isinstance(row, dict) for key in row]
    except (KeyError, IndexError, TypeError):
        return True
    return not all(str(key).startswith("token_id:") for key in keys)


def bounded_facts(described: dict) -> dict | None:
    """From an engine's description (a run's, a state file's): for an endpoint run, what it
    knows exactly, as lower bounds and as intervals, and each statistic's label in ``exactness``;
    None for any other engine. Where a text-keyed answer left an entry of a top 10 without a sure
    id (``ambiguous_positions``), the same top, the compared top-1 p and top-5/10 agreement count
    it as a disagreement: lower bounds, so labelled; where that count is not known (a merge of
    shards, a resumed run) a text-keyed run's are labelled lower bounds."""
    if described.get("engine") != EndpointEngine.name:
        return None
    k = int(described["top_k"])
    counted = described.get("ambiguous_positions")
    ambiguous = int(counted) if counted is not None else int(bool(described.get("text_keys")))

    def served(kind: str) -> list[str]:
        return [label for s in STATISTICS if s.served == kind and k >= s.min_k for label in s.labels]

    tops, interval = served("top"), served("interval")
    exact = served("exact") + ([] if ambiguous else tops)
    lower = served("lower_bound") + (tops if ambiguous else [])
    return {
        "top_k": k,
        "api": described.get("endpoint_api"),
        "exact": exact,
        "lower_bounds": lower,
        "interval": interval,
        "ambiguous_positions": ambiguous,
        "exactness": {
            **dict.fromkeys(exact, "exact"),
            **dict.fromkeys(lower, "lower_bound"),
            **dict.fromkeys(interval, "interval"),
        },
    }
