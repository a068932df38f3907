"""What an engine is and does, as the runs see it (docs/design.md, "Adding an engine").

Every engine has ``facts``, one frozen value fixed once it is built, and does the four things
of ``Model``: tokenize, name its tokens, give the logits of a batch of windows block by block,
and close. An engine whose logits never reach kldtool (vLLM's hook reduces them in its workers,
the endpoint engine gets log-probs from a server) is a ``Scorer`` instead: it scores, encodes
and gives NLLs itself. What either can do beyond that is named in its registry entry's
capabilities (``CAN``) and reached through the small protocols below; the runs
(pipeline/engine_modes.py) turn these into compare, base and ppl passes, so no engine
implements a mode it has no part in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:  # the engines' packages read their capabilities from here before numpy loads
    import numpy as np

# Capabilities an entry may name (engines/registry.py's EngineEntry.can).
HIDDEN = "hidden"  # base --store hidden: hidden_blocks and output_head (HiddenStates)
ROUTING = "routing"  # MoE routing: routing_shape and record_routing (Routing)
SCHEDULE = "schedule"  # its own way of running batches: schedule(batches) (llama.cpp's lanes)
SCORES = "scores"  # a Scorer: no logits leave the engine
BOUNDED = "bounded"  # its KLD is a lower bound (it sees the compared model's top K only)
SAMPLES = "samples"  # kldtool generate: chat_template, tokenize_rendered and sample (Sampler)
CAN = (HIDDEN, ROUTING, SCHEDULE, SCORES, BOUNDED, SAMPLES)

# The facts an engine's record (``description``) holds unless the engine names others: a served
# model has no source on this machine, llama.cpp's logits are always on the CPU.
RECORDED = ("engine", "model", "source", "dtype", "device", "versions")


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What an engine is, and its one description: its vocabulary and token policy, what its
    numbers depend on (the fields ``manifest.py`` compares between runs), what outputs record of
    it (``description``: the facts named in ``recorded``, then ``details``), and what it can do
    (``can``: its registry entry's capabilities, which ``engines.make_engine`` sets with the
    ``source``; no engine names them itself, and ``registry.has`` finds an engine built directly
    by its name)."""

    name: str
    n_vocab: int
    bos_id: int | None = None  # put first in every text (llama.cpp's add_bos), or None
    prefix_id: int | None = None  # lm-eval's token before a document (rolling): BOS, else EOS
    n_ctx_train: int | None = None  # the longest context it was trained for, if known
    pad_id: int | None = None  # targets ppl leaves unscored (a python factory's)
    model: str | None = None  # its model's path, or the name a server gives it
    dtype: str | None = None
    device: str = "cpu"  # where its logits are (a torch device), or "server"
    versions: Mapping[str, str] | None = None  # the packages that computed its numbers
    tensor_parallel: int = 1
    runner: str | None = None  # vLLM's model-runner generations the hook is installed in
    eager: bool | None = None  # vLLM without CUDA graphs or compilation (None: not vLLM)
    cpu_isa: str | None = None  # llama.cpp's build's instruction set
    backend: str | None = None  # llama.cpp's backend: "CPU", or the GPUs and the layers they hold
    kv_cache: str | None = None  # llama.cpp's K and V cache type (f16: its default)
    flash_attn: str | None = None  # llama.cpp's flash attention: auto, on or off
    source: Mapping[str, Any] | None = None  # where its model came from (model_ref's record)
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # its record's own keys
    recorded: tuple[str, ...] = RECORDED
    can: frozenset[str] = frozenset()

    def __post_init__(self):
        unknown = set(self.can) - set(CAN)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}")
        unknown = set(self.recorded) - set(_FIRST) - set(_LAST)
        if unknown:
            raise ValueError(f"unknown recorded facts {sorted(unknown)}")


_FIRST = ("engine", "model", "source", "dtype", "device")
_LAST = ("kv_cache", "flash_attn", "versions", "cpu_isa")


def description(facts: Facts) -> dict:
    """What outputs record of an engine (the JSON's "model" block, a base file's header, a
    state file's): the facts it records, its own details between them. Runs read some of it
    back from files (provenance/identity.py, the noise floor, a merge of endpoint shards)."""
    value = {
        "engine": facts.name,
        "model": facts.model,
        "source": facts.source,
        "dtype": facts.dtype,
        "device": facts.device,
        "kv_cache": facts.kv_cache,
        "flash_attn": facts.flash_attn,
        "versions": dict(facts.versions) if facts.versions is not None else None,
        "cpu_isa": facts.cpu_isa,
    }
    first = {k: value[k] for k in _FIRST if k in facts.recorded}
    return first | dict(facts.details) | {k: value[k] for k in _LAST if k in facts.recorded}


class Engine(Protocol):
    """What every engine has, whichever way it scores."""

    facts: Facts

    def tokenize(self, text: bytes) -> np.ndarray:
        """The whole text's ids, special tokens as the model adds them, no EOS."""

    def token_strings(self) -> Iterable[bytes]:
        """The vocabulary's token texts in id order (hashed into the tokenizer identity)."""

    def windows_per_call(self, n_ctx: int) -> int:
        """How many windows of ``n_ctx`` tokens one call should get."""

    def close(self) -> None: ...


@runtime_checkable
class Model(Engine, Protocol):
    """An engine whose logits the runs reduce."""

    def logit_blocks(self, windows: list) -> Iterator[tuple[int, int, Any]]:
        """(window number in ``windows``, first scored row, logits of the following rows) in
        order: a float torch tensor on ``facts.device`` or a float32 numpy array, possibly a
        view of the engine's buffers, valid until the next block. An engine that carries
        state across a window (a KV cache) gives a long window in blocks, so no tensor of
        window x vocabulary ever exists."""


@runtime_checkable
class Scorer(Engine, Protocol):
    """An engine that scores where its logits are: compare's records, base's rows and ppl's
    NLLs come back from it, never the logits."""

    def rows_source(self, reader, chunks: list[int]):
        """What ``score`` reads base rows from (``reader`` itself, or its path for workers)."""

    def score(self, windows: list, source) -> list:
        """Per window, its TokenRecords against the base rows ``source`` gives."""

    def encode(self, windows: list, coding) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(window number, its base rows or top-K records as ``coding`` says, float32 NLLs)."""

    def nll(self, windows: list) -> list[np.ndarray]:
        """Per window, the float32 NLL of each target."""


class HiddenStates(Protocol):
    """``base --store hidden``: the final hidden states and the head that makes the logits."""

    def hidden_blocks(self, windows: list, probe_rows=None) -> Iterator[tuple[int, int, Any, Any, Any]]:
        """(window number, first scored row, hidden states of the following rows in the
        model's dtype, their logits, None); a Scorer gives their NLLs for the None, and logits
        only for the first ``probe_rows(window)`` rows (the replay probe's), else None."""

    def output_head(self):
        """The head as the engine applies it (logitsfile/hidden.py's OutputHead)."""


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How ``kldtool generate`` samples, as the ecosystem's flags name it: temperature 0 is
    greedy; top_k 0, top_p 1 and min_p 0 are off; max_tokens new tokens at most."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 256


class Sampler(Protocol):
    """``kldtool generate``: the model's own answers to prompts."""

    def chat_template(self):
        """The model's chat template (text/chat.py's ChatTemplate) with its tokenizer's special
        tokens, or None where the model has none."""

    def tokenize_rendered(self, text: str) -> np.ndarray:
        """A rendered prompt's ids: special tokens written in the text are parsed, none added."""

    samples_per_call: int  # prompts one ``sample`` call takes at most (an engine that batches: many)

    def sample(self, prompts: list[np.ndarray], sampling: Sampling, seeds: list[int]) -> list[tuple[np.ndarray, str]]:
        """Per prompt, (the generated ids, "stop" when an end-of-turn token ended them (kept) or
        "length"), the same for the same prompt, settings and seed in the same call."""


class Routing(Protocol):
    """A mixture of experts' routing, read where the engine's routers choose."""

    def routing_shape(self):
        """routing/rows.py's RouterShape, or None for a model without routers."""

    def record_routing(self):
        """Start filing each scored row's experts; ``pop(window index)`` gives a window's."""


def label(engine) -> str:
    """The engine as a run's first line names it: its name and its own note (llama.cpp's backend,
    a server's form), if it has one."""
    return engine.facts.name + getattr(engine, "header_note", "")


def carried_blocks(window, size: int) -> Iterator[tuple[int, int, int]]:
    """(a, b, lo) per block of a window run ``size`` tokens at a time through state the engine
    carries (a KV cache, a recurrent state): tokens a..b-1 go in, and positions lo..b-1 are
    scored (none when lo == b, a block before the first scored position)."""
    end = window.first + window.n_scored
    for a in range(0, end, size):
        b = min(a + size, end)
        yield a, b, max(a, window.first)


def whole_windows(logits: list) -> Iterator[tuple[int, int, Any]]:
    """``logit_blocks`` of an engine that computes whole windows: one block each."""
    for i, lg in enumerate(logits):
        yield i, 0, lg
