"""The model a server serves, as its ``/v1/models`` lists it: the list checked, the one asked
for (``--endpoint-model``) or the first, and the tokenizer that goes with it, loaded here."""

from __future__ import annotations

from kldtool.engines import hf_tokenizer
from kldtool.engines.contract import Facts
from kldtool.errors import EngineError, UsageError


class Listed:
    """The served model's entry (``entry``), the whole list (``answer``, recorded with a run)
    and its tokenizer (hf_tokenizer.ServedTokenizer), its vocabulary size known."""

    def __init__(self, client, model: str | None, tokenizer: str | None):
        listed = client.get("/v1/models").get("data")
        if not isinstance(listed, list) or not listed or not all(isinstance(m, dict) and "id" in m for m in listed):
            raise EngineError(f"{client.url}/v1/models: no model list (not an OpenAI-compatible server?)")
        by_id = {m["id"]: m for m in listed}
        if model is not None and model not in by_id:
            raise UsageError(f"--endpoint-model {model}: {client.url} serves {', '.join(sorted(map(str, by_id)))}")
        self.entry = by_id[model] if model is not None else listed[0]
        self.answer = listed
        self.loaded = hf_tokenizer.served_tokenizer(tokenizer, self.entry)
        if self.loaded.n_vocab is None:
            raise EngineError(f"{self.loaded.path}: its config names no vocabulary size")

    def facts(self, name: str, server: str, bos_id: int | None, **details) -> Facts:
        """The served model's Facts: the server's, the tokenizer's, and ``details`` of the engine."""
        t = self.loaded
        return Facts(
            name=name,
            n_vocab=int(t.n_vocab),
            bos_id=bos_id,
            prefix_id=t.prefix_id,
            n_ctx_train=t.n_ctx_train,
            model=self.entry["id"],
            device="server",
            details={"server": server, "tokenizer": t.path, **details, "models_answer": self.answer},
            recorded=("engine", "model", "device"),
        )
