"""``kldtool generate --endpoint``: a served model's own answers, with the log-probs the server
reports for every token it sampled (engines/endpoint/sampled.py), from any OpenAI-compatible
server, prompt log-probs or not: the raw material of ``compare --generated``'s unbiased
KL(served‖base).

Chat prompts go to the chat API by default, where the server renders its own template: the
prompt kldtool stores is the template rendered here, and where the server counts another number
of prompt tokens than that, each such sample is counted and the run says so in one line (a
provider that adds a system prompt measures its model on another prompt: a finding, not
hidden). ``--endpoint-api completions`` sends the prompt rendered here instead: as token ids
where the server takes them (vLLM: the prompt is then exactly the stored one), else as text.
One request per sample, each with its sample's seed; the client's key, retries, deadline and
concurrency are the endpoint engine's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np

from kldtool.engines import hf_tokenizer
from kldtool.engines.contract import Sampling
from kldtool.engines.endpoint.client import Client
from kldtool.engines.endpoint.listing import Listed
from kldtool.engines.endpoint.pieces import Pieces
from kldtool.engines.endpoint.sampled import MAX_TOP_LOGPROBS, chat_body, completion_body, read_answer
from kldtool.engines.hf_chat import HfChat
from kldtool.errors import AccessDenied, EngineError, UsageError

DEFAULT_TOP_LOGPROBS = 20


class EndpointSampler(HfChat):
    """contract.py's Sampler over a server's completions or chat API."""

    name = "endpoint"
    wants_prompts = True  # sample() takes the prompts' own form too (a chat's messages)

    @classmethod
    def from_options(cls, opts, n_ctx: int) -> "EndpointSampler":
        s = opts.specific
        return cls(
            s.url, opts.model, s.model, s.top_k, s.concurrency, s.api, s.timeout, s.follow_redirects
        )  # fmt: skip

    def __init__(self, url, tokenizer, model, top_logprobs, concurrency, api, timeout, follow_redirects):
        if api not in ("auto", "chat", "completions"):
            raise UsageError(f"generate --endpoint-api {api}: chat, completions or auto (chat for chat prompts)")
        self.k = DEFAULT_TOP_LOGPROBS if top_logprobs is None else top_logprobs
        if not 1 <= self.k <= MAX_TOP_LOGPROBS:
            raise UsageError(f"--top-logprobs {self.k}: 1 to {MAX_TOP_LOGPROBS} (the chat API's most)")
        self.client = Client(url, timeout=timeout, follow_redirects=follow_redirects)
        self.url, self.api, self.concurrency = self.client.url, api, concurrency
        served = Listed(self.client, model, tokenizer)
        self.model_id = served.entry["id"]
        self.max_model_len = served.entry.get("max_model_len")
        loaded = served.loaded
        self.tokenizer, self.n_vocab, self.bos_id = loaded.tokenizer, int(loaded.n_vocab), loaded.bos_id
        self.pieces = Pieces(self.tokenizer, self.n_vocab)
        self.samples_per_call = max(concurrency, 1) * 4
        self.prompt_ids = None  # decided at the first completions request: ids, or text
        self.differ = 0  # samples whose prompt the server counted otherwise than it is stored
        self.first_difference = None  # (the server's count, the stored prompt's)
        self.facts = served.facts(self.name, self.url, self.bos_id, top_logprobs=self.k)

    def tokenize(self, text: bytes) -> np.ndarray:
        return hf_tokenizer.tokenize(self.tokenizer, text, self.bos_id)

    def token_strings(self):
        return hf_tokenizer.token_strings(self.tokenizer, self.n_vocab)

    def _chat(self, prompt) -> bool:
        return prompt is not None and prompt.is_chat and self.api != "completions"

    def _completion_prompt(self, ids: np.ndarray):
        """The prompt as ids where the server takes them (asked once, with a one-token request),
        else as the text they print."""
        if self.prompt_ids is None:
            body = completion_body(self.model_id, [int(t) for t in ids], Sampling(max_tokens=1), 0, 1)
            # asked once, never retried: a refusal is the answer (llama-cpp-python's is a 500)
            probe = Client(self.url, timeout=self.client.timeout, retries=0, follow_redirects=self.client._http.follow)
            try:
                probe.post("/v1/completions", body)
                self.prompt_ids = True
            except AccessDenied:
                raise
            except EngineError:  # a 4xx, or a 5xx it would not take back (llama-cpp-python's)
                self.prompt_ids = False
            finally:
                probe.close()
        if self.prompt_ids:
            return [int(t) for t in ids]
        skip = 1 if len(ids) and int(ids[0]) == self.bos_id else 0  # the server adds its own BOS
        # special tokens as their text (a chat template's markers), for the server to parse
        return self.tokenizer.decode([int(t) for t in ids[skip:]], skip_special_tokens=False)

    def _one(self, ids: np.ndarray, prompt, s: Sampling, seed: int, where: str):
        if self._chat(prompt):
            body = chat_body(self.model_id, list(prompt.messages), s, seed, self.k)
            answer = self.client.post("/v1/chat/completions", body)
            return read_answer(answer, True, s, self.k, self.pieces, self.n_vocab, where)
        body = completion_body(self.model_id, self._completion_prompt(ids), s, seed, self.k)
        answer = self.client.post("/v1/completions", body)
        return read_answer(answer, False, s, self.k, self.pieces, self.n_vocab, where)

    def sample(self, prompts: list[np.ndarray], s: Sampling, seeds: list[int], sources=None):
        """Per prompt (ids, finish, what the server said of it: text/generated.py's ``served``)."""
        sources = sources or [None] * len(prompts)
        plain = next((ids for ids, src in zip(prompts, sources) if not self._chat(src)), None)
        if plain is not None and self.prompt_ids is None:
            self._completion_prompt(plain)  # decided once, before the requests go out together

        def one(k: int):
            return self._one(prompts[k], sources[k], s, seeds[k], f"{self.url}: sample with seed {seeds[k]}")

        with ThreadPoolExecutor(max_workers=max(min(len(prompts), self.concurrency), 1)) as pool:
            answers = list(pool.map(one, range(len(prompts))))
        for ids, got in zip(prompts, answers):  # counted here, not in the threads
            if got.prompt_tokens is not None and got.prompt_tokens != len(ids):
                self.differ += 1
                self.first_difference = self.first_difference or (got.prompt_tokens, len(ids))
        return [(got.ids, got.finish, got.served()) for got in answers]

    def served_from(self) -> dict:
        """Where the answers came from, for the corpus header (no query: it may hold a key)."""
        url = urlsplit(self.url)
        return {"url": f"{url.scheme}://{url.netloc}{url.path}", "top_logprobs": self.k}

    def close(self) -> None:
        self.client.close()
