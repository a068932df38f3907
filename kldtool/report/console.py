"""Console text laid out exactly as llama-perplexity prints it (docs/llama-perplexity-format.md §4.2, §6, §7)."""

from __future__ import annotations

import math

from kldtool.stats.summary import DP_PERCENTILES, KLD_PERCENTILES, KldSummary

TABLE_HEADER = (
    "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
    "              Δp RMS            Same top p"
)


def cf(spec: str, x: float) -> str:
    """printf-style float formatting with glibc's spelling of NaN and infinities."""
    if math.isnan(x) or math.isinf(x):
        neg = math.copysign(1.0, x) < 0
        word = ("-" if neg else "") + ("nan" if math.isnan(x) else "inf")
        width = spec[1:].split(".")[0]
        return word.rjust(int(width)) if width else word
    return spec % x


def ppl_progress(k: int, ppl: float) -> str:
    return f"[{k}]{ppl:.4f},"


def final_estimate(ppl: float, unc: float) -> str:
    return f"Final estimate: PPL = {ppl:.4f} +/- {unc:.5f}"


def chunk_line(k: int, s: KldSummary) -> str:
    return (
        f"{k:4d}"
        f"    {cf('%9.4f', s.ppl_q[0])} ± {cf('%9.4f', s.ppl_q[1])}"
        f"    {cf('%10.5f', s.ln_ratio[0])} ± {cf('%10.5f', s.ln_ratio[1])}"
        f"    {cf('%10.5f', s.kld_mean[0])} ± {cf('%10.5f', s.kld_mean[1])}"
        f"    {cf('%6.3f', 100 * s.rms_dp[0])} ± {cf('%6.3f', 100 * s.rms_dp[1])} %"
        f"    {cf('%6.3f', 100 * s.same_top[0])} ± {cf('%6.3f', 100 * s.same_top[1])} %"
    )


def _pm(label: str, pair, fmt: str = "%10.6f") -> str:
    return f"{label}: {cf(fmt, pair[0])} ± {cf(fmt, pair[1])}"


def _distribution(name: str, table, q: dict, fmt: str, scale: float, unit: str) -> list[str]:
    """Maximum, the upper percentiles, median, the lower ones, minimum (llama.cpp's order)."""

    def row(label, key):
        return f"{label} {name}: {cf(fmt, scale * q[key])}{unit}"

    upper = [(label, f) for label, f in table if f > 0.5]
    lower = [(label, f) for label, f in table if f < 0.5]
    return [
        row("Maximum", "max"),
        *(row(f"{label}  ", label.strip()) for label, _ in upper),
        row("Median ", "median"),
        *(row(f"{label}  ", label.strip()) for label, _ in lower),
        row("Minimum", "min"),
    ]


def final_blocks(s: KldSummary, kld: str = "KLD") -> list[str]:
    """The three statistic blocks, each followed by an empty line; ``kld``: the KLD's label
    ("KLD ≥" where the compared model's rows are known only in part)."""
    q, d = s.kld_quantiles, s.dp_quantiles
    lines = [
        "====== Perplexity statistics ======",
        _pm("Mean PPL(Q)                   ", s.ppl_q),
        _pm("Mean PPL(base)                ", s.ppl_base),
        f"Cor(ln(PPL(Q)), ln(PPL(base))): {cf('%6.2f', 100 * s.cor)}%",
        _pm("Mean ln(PPL(Q)/PPL(base))     ", s.ln_ratio),
        _pm("Mean PPL(Q)/PPL(base)         ", s.ratio),
        _pm("Mean PPL(Q)-PPL(base)         ", s.diff),
        "",
        "====== KL divergence statistics ======",
        _pm(f"Mean    {kld}", s.kld_mean),
        *_distribution(kld, KLD_PERCENTILES, q, "%10.6f", 1.0, ""),
        "",
        "====== Token probability statistics ======",
        f"Mean    Δp: {cf('%6.3f', 100 * s.dp_mean[0])} ± {cf('%5.3f', 100 * s.dp_mean[1])} %",
        *_distribution("Δp", DP_PERCENTILES, d, "%6.3f", 100.0, "%"),
        f"RMS Δp    : {cf('%6.3f', 100 * s.rms_dp[0])} ± {cf('%5.3f', 100 * s.rms_dp[1])} %",
        f"Same top p: {cf('%6.3f', 100 * s.same_top[0])} ± {cf('%5.3f', 100 * s.same_top[1])} %",
        "",
    ]
    return lines


def extra_block(stats: dict) -> list[str]:
    """kldtool's statistics after llama.cpp's three blocks: extra metrics, KLD by the base's
    top-1 probability and the block bootstrap beside the i.i.d. uncertainties."""
    e = stats["extra"]
    top = e["top_k_agreement"]
    ge = " ≥" if stats.get("endpoint") else ""
    lines = [
        "====== kldtool: more statistics ======",
        _pm(f"Mean    reverse KLD{ge}", _pair(e["rkld_mean"])),
        _pm(f"Mean    JSD        {ge}", _pair(e["jsd_mean"])),
        *_tv_lines(e.get("tv")),
        *(
            f"Top-{k:<2} agreement  : {cf('%6.3f', 100 * top[k]['value'])} ± "
            f"{cf('%5.3f', 100 * top[k]['uncertainty'])} %"
            for k in ("1", "5", "10")
        ),
        *_same_sample_lines(e),
        *_confidence_lines(e.get("confidence")),
        "",
        "Base top-1 p     tokens      mean KLD    99.0% KLD",
    ]
    for b in e["top1_buckets"]:
        lo, hi = b["range"]
        shown = [cf("%10.6f", b[k]) if b[k] is not None else f"{'-':>10}" for k in ("kld_mean", "kld_99")]
        lines.append(
            f"[{lo:.2f}, {hi:.2f}{']' if hi == 1.0 else ')'}    {cf('%6.2f', 100 * b['share'])} %"
            f"    {shown[0]}   {shown[1]}"
        )
    lines.append("")
    noise = stats.get("noise_floor")
    if noise:
        lines += [
            f"Mean KLD = {noise['multiple']:.1f} x the noise floor ({noise['kld_mean']:.3g}, {noise['source']})",
            "",
        ]
    lines += _endpoint_lines(stats.get("endpoint"))
    top = stats.get("compact_base")
    if top:
        lines += [
            f"Top-{top['keep']} base file: Mean KLD above is the lower bound (the unstored entries as one bucket)",
            f"Tail estimate (ranks {top['keep'] // 2 + 1}..{top['keep']}): {cf('%10.6f', top['tail_estimate'])}"
            f"   estimate {cf('%10.6f', top['kld_mean_estimate'])}",
            f"Mean KLD within [{top['kld_mean_lower_bound']:.6f}, {top['kld_mean_lower_bound'] + top['bound']:.6f}]"
            f" (bound {top['bound']:.6f} = {top['allowance']} x tail estimate, empirical)",
            "",
        ]
    return lines + _bootstrap_lines(stats)


def _bootstrap_lines(stats: dict) -> list[str]:
    """The block bootstrap's error bars beside the i.i.d. ones, when the run has them."""
    boot = stats.get("bootstrap")
    if not boot:
        return []
    lines = [
        f"Block bootstrap over {boot['blocks']} chunks ({boot['resamples']} resamples, seed {boot['seed']}): "
        f"± standard error [95 % interval], i.i.d. ± beside"
    ]
    for label, key, pair, scale, fmt in (
        ("Mean    KLD              ", "kld_mean", stats["kld_mean"], 1.0, "%10.6f"),
        ("Mean ln(PPL(Q)/PPL(base))", "ln_ppl_ratio", stats["ln_ppl_ratio"], 1.0, "%10.6f"),
        ("Same top p               ", "same_top_p", stats["same_top_p"], 100.0, "%10.4f"),
    ):
        b = boot[key]
        lo, hi = b["interval_95"]
        lines.append(
            f"{label}: {cf(fmt, scale * pair['value'])} ± {cf(fmt, scale * b['standard_error'])} "
            f"[{cf(fmt, scale * lo).strip()}, {cf(fmt, scale * hi).strip()}]"
            f"   (i.i.d. ± {cf(fmt, scale * pair['uncertainty']).strip()})"
        )
    return lines + [""]


def _same_sample_lines(e: dict) -> list[str]:
    """Σ p·q beside the top-k agreement (absent from runs that predate it): a lower bound where
    the rows are known in part (the total variation then an interval)."""
    m = e.get("same_sample_p")
    if not m:
        return []
    bound = "" if e["tv"]["exact"] else " (a lower bound: rows known in part)"
    return [f"Same sampled p    : {cf('%6.3f', 100 * m['value'])} ± {cf('%5.3f', 100 * m['uncertainty'])} %{bound}"]


def _confidence_lines(c: dict | None) -> list[str]:
    """Both models' mean top-1 probability and its shift (absent from runs that predate it)."""
    if not c or c["ptop_q_mean"] is None:
        return []
    shift = c["shift"]
    return [
        f"Mean    top-1 p    : {cf('%6.3f', 100 * c['ptop_q_mean'])} % (base {cf('%6.3f', 100 * c['ptop_base_mean'])} %),"
        f" shift {cf('%6.3f', 100 * shift['value'])} ± {cf('%5.3f', 100 * shift['uncertainty'])} %"
    ]


def _tv_lines(tv: dict | None) -> list[str]:
    """Total variation and the speculative acceptance rate: a mean with its ±, or, where the
    compared rows are known in part, the interval the mean lies in."""
    if not tv:
        return []
    lo, hi = tv["acceptance"]
    if not tv["exact"]:
        return [
            f"Mean    TV within    : [{cf('%.6f', tv['mean']['value'])}, {cf('%.6f', tv['mean_upper'])}]",
            f"Acceptance 1 - TV    : [{cf('%.4f', 100 * lo)}, {cf('%.4f', 100 * hi)}] %",
        ]
    return [
        _pm("Mean    TV         ", _pair(tv["mean"])),
        f"Median  TV         : {cf('%10.6f', tv['median'])}   99.0% TV: {cf('%10.6f', tv['p99'])}",
        f"Acceptance 1 - TV  : {cf('%7.4f', 100 * hi)} %",
    ]


def _endpoint_lines(e: dict | None) -> list[str]:
    if not e:
        return []
    k = e["top_k"]
    shown = [cf("%.6f", e[f]) if e[f] is not None else "-" for f in ("p_out_mean", "p_out_99")]
    return [
        f"Endpoint, top {k} log-probs a position: KLD, reverse KLD and JSD are lower bounds (the top {k} "
        f"and the target exact, the rest one bucket); PPL, Δp and same top are exact",
        f"Base mass outside them: mean {shown[0]}, 99.0% {shown[1]}",
        f"KLD estimate {cf('%10.6f', e['kld_mean_estimate'])} = bound + tail {cf('%.6f', e['tail_estimate'])} "
        f"(tail model: the tails diverge as the returned ranks {k // 2 + 1}..{k} do)",
        "",
    ]


def _pair(d: dict) -> tuple[float, float]:
    return d["value"], d["uncertainty"]
