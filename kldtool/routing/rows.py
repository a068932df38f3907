"""What a model's routers chose: a shape (which layers route, how many experts, how many per
token, how the router scores them) and, per scored position and routed layer, the k expert ids
and the router's probabilities of those k, renormalised over them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCORINGS = ("softmax", "sigmoid")  # Qwen, Mixtral, gpt-oss; DeepSeek V3, Kimi K2, GLM
MAX_EXPERTS = 65_536
MAX_K = 64
MAX_LAYERS = 1024
PROB_DTYPE = np.dtype("<f2")


@dataclass(frozen=True)
class RouterShape:
    layers: tuple[int, ...]  # the decoder layers that route, in order
    k: int  # experts chosen per token
    n_experts: int
    scoring: str

    @property
    def id_dtype(self) -> np.dtype:
        return np.dtype("u1") if self.n_experts <= 256 else np.dtype("<u2")

    @property
    def bytes_per_token(self) -> int:
        return len(self.layers) * self.k * (self.id_dtype.itemsize + PROB_DTYPE.itemsize)

    def describe(self) -> dict:
        return {
            "layers": list(self.layers),
            "k": self.k,
            "n_experts": self.n_experts,
            "scoring": self.scoring,
            "bytes_per_token": self.bytes_per_token,
        }

    @classmethod
    def from_metadata(cls, d) -> "RouterShape":
        """The shape a file's metadata records, checked before anything is sized from it."""
        try:
            layers = tuple(int(x) for x in d["layers"])
            shape = cls(layers, int(d["k"]), int(d["n_experts"]), str(d["scoring"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"routing metadata {d!r}: {e}") from None
        if shape.scoring not in SCORINGS or not 0 < shape.n_experts <= MAX_EXPERTS:
            raise ValueError(f"routing of {shape.n_experts} experts scored by {shape.scoring!r}")
        if not 0 < shape.k <= min(MAX_K, shape.n_experts) or not 0 < len(layers) <= MAX_LAYERS:
            raise ValueError(f"routing of {shape.k} experts per token over {len(layers)} layers")
        if list(layers) != sorted(set(layers)) or layers[0] < 0:
            raise ValueError(f"routing layers {list(layers)} are not distinct, increasing and non-negative")
        return shape


@dataclass
class Routed:
    """Per scored position (rows) and routed layer: the chosen ids (int16, n x L x k) and the
    router's probabilities of them, renormalised over them (float32, n x L x k); ``scores``,
    where an engine gives them at compare time, the router's score of every expert (n x L x E)."""

    ids: np.ndarray
    probs: np.ndarray
    scores: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def concat(cls, parts: list["Routed"]) -> "Routed":
        if len(parts) == 1:
            return parts[0]
        scores = None if any(p.scores is None for p in parts) else np.concatenate([p.scores for p in parts])
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.probs for p in parts]), scores)


def expert_scores(logits, scoring: str):
    """The router's score of each expert from its logits (a torch tensor, last axis the
    experts): the softmax, or DeepSeek's per-expert sigmoid. Renormalised over any k experts,
    either gives the weights the model mixes those experts with."""
    import torch

    x = logits.float()
    return torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)


def chosen_probs(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The scores of experts ``ids`` (same leading axes), renormalised over them (float64)."""
    picked = np.take_along_axis(np.asarray(scores, np.float64), ids.astype(np.int64), axis=-1)
    return picked / picked.sum(axis=-1, keepdims=True)
