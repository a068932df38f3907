"""Size against mean KLD on a recipe's cost windows: each recipe's predicted frontier as a line
(corrected, and the additive prediction dotted), its built rounds as stars at what was measured,
and llama.cpp's mixes as labelled points. Drawn by ``recipe`` beside its GGUF and by ``report``."""

from __future__ import annotations

import os


def draw(recipes: list[dict], mixes: list[dict], path: str) -> None:
    """``recipes``: each with ``label`` (None for one alone), ``frontier`` and ``rounds``;
    ``mixes``: each with ``name``, ``bytes`` and ``kld``. The PNG is written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn: set = set()
    for r in recipes:
        tag = f" ({r['label']})" if r.get("label") else ""
        points = r["frontier"]
        key = tuple((q["bytes"], q["predicted"]) for q in points)
        mb = [q["bytes"] / 1e6 for q in points]
        if key not in drawn:  # recipes from one cost run share a frontier: drawn once
            drawn.add(key)
            (line,) = ax.plot(mb, [q["predicted"] for q in points], label=f"predicted frontier (corrected){tag}")
            ax.plot(mb, [q["predicted_additive"] for q in points], linestyle=":", color=line.get_color(),
                    label=f"additive prediction{tag}")  # fmt: skip
        built = r["rounds"]
        ax.scatter([b["size"] / 1e6 for b in built], [b["measured"] for b in built], marker="*", s=120, zorder=3,
                   label=f"built recipe (measured){tag}")  # fmt: skip
    seen = set()
    for m in mixes:
        if m["name"] in seen:
            continue
        seen.add(m["name"])
        ax.scatter([m["bytes"] / 1e6], [m["kld"]], marker="o", color="black", zorder=3)
        ax.annotate(m["name"], (m["bytes"] / 1e6, m["kld"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("size (MB)")
    ax.set_ylabel("mean KLD (cost windows)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = f"{path}.partial-{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
