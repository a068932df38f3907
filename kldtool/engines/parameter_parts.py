"""Where a GGUF tensor sits when transformers keeps it inside a larger parameter: a part is
``(dimension, start, length)`` of the parameter, or ``(dimension, start, length, shape)`` to view
the parameter in that shape first (DeepSeek's per-head key and value rows of one ``kv_b_proj``);
None is the whole parameter. recipe/expert_slots.py and engines/latent_gguf.py name the parts."""

from __future__ import annotations


def part_of(values, part: tuple | None):
    """The part of ``values`` (a torch tensor) that ``part`` names, as a view."""
    if part is None:
        return values
    if len(part) == 4:
        values = values.view(part[3])
    return values.narrow(*part[:3])
