"""The experts a transformers MoE model's routers chose, read from the routers themselves:
transformers' routers (Qwen 3 MoE, Mixtral, DeepSeek V3 / Kimi K2, GLM, gpt-oss) all return
(logits, weights, expert ids), so a forward hook sees the ids the model then used, ties broken
as the model broke them, with no second computation."""

from __future__ import annotations

import re

from kldtool.routing.rows import Routed, RouterShape, expert_scores

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_routers(model) -> list[tuple[int, object]]:
    """(decoder layer, router module) of every routed layer, in layer order."""
    found = []
    for name, module in model.named_modules():
        if type(module).__name__.lower().endswith("topkrouter"):
            m = _LAYER.search(name)
            if m:
                found.append((int(m.group(1)), module))
    return sorted(found, key=lambda x: x[0])


def router_shape(model) -> RouterShape | None:
    routers = find_routers(model)
    if not routers:
        return None
    r = routers[0][1]
    # DeepSeek's routers score each expert with a sigmoid, and carry a correction bias for the choice.
    scoring = "sigmoid" if hasattr(r, "e_score_correction_bias") else "softmax"
    return RouterShape(tuple(layer for layer, _ in routers), int(r.top_k), int(r.num_experts), scoring)


class RouterTap:
    """Forward hooks on every router; after each forward, :meth:`keep` files the rows a block
    scores under its window's number, and :meth:`pop` hands a window's rows over once."""

    def __init__(self, model, shape: RouterShape):
        self.shape = shape
        self.last: list = [None] * len(shape.layers)
        self.kept: dict[int, list[Routed]] = {}
        self.hooks = [
            module.register_forward_hook(self._caught(j)) for j, (_, module) in enumerate(find_routers(model))
        ]

    def _caught(self, j: int):
        def hook(module, inputs, out):
            self.last[j] = (out[0].detach(), out[2].detach())

        return hook

    def keep(self, indices: list[int], start: int, n: int) -> None:
        """Rows start .. start+n-1 of each sequence of the last forward as the next rows of
        windows ``indices`` (one per sequence), in a few batched operations and one copy to the host."""
        import torch

        s, batch = self.shape, len(indices)
        logits = torch.stack([lg.view(batch, -1, s.n_experts)[:, start : start + n] for lg, _ in self.last], dim=2)
        ids = torch.stack([ch.view(batch, -1, s.k)[:, start : start + n] for _, ch in self.last], dim=2)
        scores = expert_scores(logits, s.scoring)
        picked = scores.gather(-1, ids.long())
        probs = (picked / picked.sum(dim=-1, keepdim=True)).cpu().numpy()
        ids_np, scores_np = ids.to(torch.int16).cpu().numpy(), scores.cpu().numpy()
        for b, index in enumerate(indices):
            self.kept.setdefault(index, []).append(Routed(ids_np[b], probs[b], scores_np[b]))

    def pop(self, index: int) -> Routed:
        return Routed.concat(self.kept.pop(index))

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks, self.kept = [], {}
