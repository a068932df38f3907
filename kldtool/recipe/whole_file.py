"""A GGUF's every recipe tensor at once, scored on the cost windows through the costs' own
forward (the source dequantized by transformers, those tensors swapped in): a round's recipe, and
a llama.cpp mix beside the frontier it is plotted against."""

from __future__ import annotations


def score_file(engine, reader, windows, cands, dtype: str, path: str, tensors, held=None) -> float:
    """Mean KLD on ``windows`` with each of ``tensors`` as the GGUF at ``path`` holds it."""
    from kldtool.attribute.kld import all_swapped, mean_kld, window_vectors
    from kldtool.attribute.units import load_quant
    from kldtool.recipe.costs import tensor_unit
    from kldtool.recipe.expert_slots import composed

    q = load_quant(path, dtype).state_dict()
    model = engine.model
    values = composed(model, q, cands.params, cands.parts, tensors, model.device)  # one unit a parameter
    units = [tensor_unit(model, pname, pname, v) for pname, v in values.items()]
    with all_swapped(units):
        return mean_kld(window_vectors(engine, reader, windows, held))
