"""One ``kldtool attribute`` run: load both models, take the base file's first windows, measure
every unit's output error in one streamed pass, then the KLD attribution of the units the
budget allows (the largest output errors first), and rank."""

from __future__ import annotations

import sys

from kldtool.attribute.kld import MODES, attribute_kld
from kldtool.attribute.layer_errors import measure
from kldtool.attribute.expert_units import expert_units
from kldtool.attribute.units import GRANULARITIES, find_units, load_quant
from kldtool.errors import MismatchError, UsageError
from kldtool.runtime.progress import Progress


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_modes(spec: str) -> tuple[str, ...]:
    if spec == "none":
        return ()
    modes = tuple(m.strip() for m in spec.split(",") if m.strip())
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(f"--kld {spec!r}: expected in, out, in,out or none")
    return modes


def rank_key(row: dict):
    """Largest leave-one-out gain first, else largest leave-one-in KLD, else output error."""
    if "out" in row:
        return -row["out"]["gain"]
    if "in" in row:
        return -row["in"]["kld_mean"]
    return -row["rel_rms"]


def run_attribute(base_model, quant, base_file, chunks, granularity, dtype, device, modes, budget, spec) -> dict:
    from kldtool.engines.registry import entry
    from kldtool.logitsfile import open_base_file
    from kldtool.text.protocols import stored_windows

    if granularity not in GRANULARITIES:
        raise UsageError(f"--granularity {granularity!r}: expected one of {', '.join(GRANULARITIES)}")
    reader = open_base_file(base_file)
    try:
        base = entry("transformers").load()(base_model, dtype=dtype, device=device)  # it edits the model's weights
        if base.facts.n_vocab != reader.header.n_vocab:
            raise MismatchError(
                f"{base_file}: written for a vocabulary of {reader.header.n_vocab}, {base_model} has {base.facts.n_vocab}"
            )
        windows = stored_windows(reader.tokens, reader.header, base.facts.bos_id)[:chunks]
        if granularity == "expert":
            units = expert_units(base.model, load_quant(quant, dtype))
        else:
            units = find_units(base.model, load_quant(quant, dtype), granularity)
        scored = len(units) if budget is None else min(budget, len(units))
        n_kld = (1 + scored * len(modes) + ("out" in modes)) if modes else 0
        tokens = sum(len(w.tokens) for w in windows)
        _say(
            f"attribute: {len(units)} {granularity} units the quant changes, {len(windows)} windows ({tokens} tokens). "
            f"Cost in forwards of those windows: 2 for the output errors (the base's, and each unit's quant version "
            f"once), "
            + (
                f"{n_kld} for the KLD attribution ({scored} units x {len(modes)} modes + references)"
                if modes
                else "none for the KLD attribution (--kld none)"
            )
        )
        with Progress("attribute: output errors", len(windows)) as shown:
            errors = measure(base.model, units, windows, device, shown.to)
        rows = {u.name: {"name": u.name, "layer": u.layer, "params": u.numel} | errors[u.name] for u in units}
        by_error = sorted(units, key=lambda u: -rows[u.name]["rel_rms"])
        refs = {}
        if modes:
            with Progress("attribute: KLD", n_kld - 1, "forwards") as shown:
                got = attribute_kld(base, reader, windows, by_error[:scored], units, modes, spec, shown.to)
            for name, r in got["units"].items():
                rows[name] |= r
            refs = got["references"]
    finally:
        reader.close()
    ranked = sorted(rows.values(), key=lambda r: (("out" not in r and "in" not in r) if modes else False, rank_key(r)))
    return {
        "base_model": base_model,
        "quant": quant,
        "base_file": base_file,
        "windows": len(windows),
        "tokens": tokens,
        "granularity": granularity,
        "dtype": dtype,
        "kld_modes": list(modes),
        "kld_units": scored if modes else 0,
        "references": refs,
        "units": ranked,
    }
