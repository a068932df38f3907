"""How a recipe moves a mixture of experts' routing: the experts every router chose over the cost
windows, caught by forward hooks on the routers (transformers' routers return the ids the model
then used), for the source and for each built round; a flip is a (token, routed layer) whose
chosen set of experts differs from the source's. llama.cpp never quantizes a router, so every
flip comes from the tensors below it."""

from __future__ import annotations

import numpy as np


class ChosenExperts:
    """While held, each router's chosen ids per forward, sorted within a token's k."""

    def __init__(self, model):
        from kldtool.engines.transformers.routing import find_routers

        self.routers = [m for _, m in find_routers(model)]
        self.caught: list[list[np.ndarray]] = [[] for _ in self.routers]
        self.hooks: list = []

    def __enter__(self) -> "ChosenExperts":
        for j, router in enumerate(self.routers):
            self.hooks.append(router.register_forward_hook(self._hook(j)))
        return self

    def _hook(self, j: int):
        def hook(module, inputs, out):
            ids = out[2].detach()
            self.caught[j].append(ids.reshape(-1, ids.shape[-1]).sort(dim=-1).values.cpu().numpy())

        return hook

    def __exit__(self, *exc) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def chosen(self) -> np.ndarray:
        """routed layers x tokens x k."""
        return np.stack([np.concatenate(c) for c in self.caught])


def routes(model) -> bool:
    from kldtool.engines.transformers.routing import find_routers

    return bool(find_routers(model))


def flips(source: np.ndarray, other: np.ndarray) -> dict:
    """The share of (routed layer, token) choices that differ, per layer and in all, and the share
    of tokens routed otherwise in some layer."""
    changed = (source != other).any(axis=-1)  # layers x tokens
    return {
        "decisions": float(changed.mean()),
        "per_layer": [float(x) for x in changed.mean(axis=1)],
        "tokens_any_layer": float(changed.any(axis=0).mean()),
    }
