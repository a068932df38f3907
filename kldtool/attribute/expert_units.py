"""``attribute --granularity expert``: a mixture of experts' units, layer by layer: each routed
expert (one slice of the layer's stacked expert tensors, named as the checkpoint names it,
``model.layers.L.mlp.experts.E``), the router (``mlp.gate``, or gpt-oss's ``mlp.router``) and the
shared expert (``mlp.shared_experts`` or ``mlp.shared_expert``). A unit is kept where the quant
changes some parameter of it."""

from __future__ import annotations

from kldtool.attribute.units import Unit, decoder_layers
from kldtool.errors import MismatchError, UsageError

ROUTERS = ("gate", "router")
SHARED = ("shared_experts", "shared_expert")


def expert_units(base, quant) -> list[Unit]:
    import torch

    qstate = quant.state_dict()
    names = {m: n for n, m in base.named_modules()}
    units, mixtures = [], 0
    for i, layer in enumerate(decoder_layers(base)):
        mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
        experts = getattr(mlp, "experts", None)
        if experts is None:
            continue
        mixtures += 1
        params = dict(experts.named_parameters())
        stacked = {k: p for k, p in params.items() if p.dim() == 3}
        if not stacked:
            raise UsageError(f"attribute: {names[experts]} keeps its experts as separate modules, not stacked tensors")
        n_experts = next(iter(stacked.values())).shape[0]
        for e in range(n_experts):
            changed, original = {}, {}
            for k, p in stacked.items():
                q = _quant(qstate, f"{names[experts]}.{k}", p)[e].detach().to("cpu", p.dtype)
                if not torch.equal(q, p[e].detach().cpu()):
                    changed[k], original[k] = q, p[e].detach().clone()
            if changed:
                n = sum(t.numel() for t in changed.values())
                units.append(
                    Unit(
                        name=f"{names[experts]}.{e}",
                        layer=i,
                        module=experts,
                        quant=changed,
                        base=original,
                        numel=n,
                        part=e,
                    )
                )
        for attr in ROUTERS + SHARED:
            module = getattr(mlp, attr, None)
            if isinstance(module, torch.nn.Module) and module is not experts:
                unit = _whole(module, names[module], i, qstate)
                if unit:
                    units.append(unit)
    if not mixtures:
        raise UsageError("attribute --granularity expert: the model has no mixture-of-experts layers")
    if not units:
        raise UsageError("attribute --granularity expert: the quant changes no expert, router or shared expert")
    return units


def _whole(module, name: str, layer: int, qstate: dict) -> Unit | None:
    import torch

    changed, original = {}, {}
    for k, p in module.named_parameters():
        q = _quant(qstate, f"{name}.{k}", p).detach().to("cpu", p.dtype)
        if not torch.equal(q, p.detach().cpu()):
            changed[k], original[k] = q, p.detach().clone()
    if not changed:
        return None
    return Unit(
        name=name,
        layer=layer,
        module=module,
        quant=changed,
        base=original,
        numel=sum(t.numel() for t in changed.values()),
    )


def _quant(qstate: dict, full: str, p):
    """The quant's tensor of the base's parameter ``full``, of the same shape."""
    q = qstate.get(full)
    if q is None or q.shape != p.shape:
        got = "none" if q is None else tuple(q.shape)
        raise MismatchError(f"attribute: {full} is {got} in the quant, {tuple(p.shape)} in the base")
    return q
