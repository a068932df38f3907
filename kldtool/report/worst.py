"""``kldtool worst``'s tables: the positions (or windows) analysis/worst.py ranks, with their text."""

from __future__ import annotations


def _show(s: str) -> str:
    return repr(s)[1:-1]


def print_tokens(rows: list[dict], by: str) -> None:
    routed = by == "routing"  # the first departing layer and how many layers flipped
    print(
        f"{'#':>3} {'chunk':>5} {'pos':>7} " + ("layer flips " if routed else "") + f"{'KLD':>9} {'Δp':>8} "
        f"{'p_base':>7} {'p_q':>7}  {'target':>12} {'base top1':>12} {'q top1':>12}  context"
    )
    for k, r in enumerate(rows, 1):
        where = f"{r['first_departing_layer']:>5} {r['layers_flipped']:>5} " if routed else ""
        print(
            f"{k:>3} {r['chunk'] + 1:>5} {r['position']:>7} {where}{r['kld']:>9.5f} {r['dp']:>+8.4f} {r['p_base']:>7.4f} "
            f"{r['p_q']:>7.4f}  {_show(r['target']):>12} {_show(r['top1_base']):>12} {_show(r['top1_q']):>12}  "
            f"…{_show(r['context'])}[{_show(r['target'])}]"
        )
    print(f"(ranked by {by})")


def print_windows(rows: list[dict]) -> None:
    print(f"{'#':>3} {'chunk':>5} {'mean KLD':>10} {'tokens':>7} {'same top':>9}  text")
    for k, r in enumerate(rows, 1):
        print(
            f"{k:>3} {r['chunk'] + 1:>5} {r['kld_mean']:>10.6f} {r['tokens']:>7} {100 * r['same_top']:>8.2f}%  "
            f"{_show(r['text'])}…"
        )
