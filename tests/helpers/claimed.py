"""The precisions the docs claim, in one table that the tests assert with and the docs render.

A test that checks a documented claim asserts with ``claimed("name")``, never a literal of its
own; ``scripts/claims.py --check`` fails where a claim's test no longer does, and where the
headline row of docs/benchmarks.md does not state the table's value. Loosening a claim means
changing its value here, which changes what the docs must say.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    value: float
    says: str  # what is within ``value``, as claims.py prints it
    test: str  # the test file that asserts with it
    # The bound on a CPU whose float32 rows depend on the batch (tests/helpers/cpu_kernels.py), where
    # the claim's numbers come from two batch compositions; None: the same on every CPU.
    batch_dependent: float | None = None


TOLERANCES = {
    "rolling.nll_sum": Claim(5e-8, "summed NLL, relative to lm-eval's", "tests/test_rolling_protocol.py"),
    # Xeon (AVX-512): 3.6e-8 measured; AMD EPYC (Zen 4), whose float32 rows depend on the batch: 1.7e-7
    "rolling.text": Claim(
        1e-7,
        "word and byte perplexity and bits per byte, relative to lm-eval's",
        "tests/test_rolling_protocol.py",
        batch_dependent=5e-7,
    ),
    "attribute.unit": Claim(1e-6, "each unit's error and KLD, relative to float64", "tests/test_attribute.py"),
    "long.f16_depth_kld": Claim(
        1e-4, "the F16 GGUF's mean KLD to its checkpoint in every depth bucket", "tests/test_long_context.py"
    ),
    "xlstm.ppl": Claim(1e-6, "xLSTM NLL and PPL at every length, relative to plain torch", "tests/test_xlstm.py"),
    "hidden.kld": Claim(
        1e-5, "hidden-state compare's mean KLD, relative to the row file's", "tests/test_hidden_gguf.py"
    ),
    "hidden.floor": Claim(1e-10, "the replay floor's mean KLD (fp32)", "tests/test_hidden_gguf.py"),
    "container.ratio": Claim(
        0.45, "the container's bytes over llama.cpp's raw file's, at most", "tests/test_base_files.py"
    ),
}


def claimed(name: str) -> float:
    """The claim's bound on the CPU running the test."""
    from helpers.cpu_kernels import float32_rows_depend_on_the_batch

    claim = TOLERANCES[name]
    if claim.batch_dependent is not None and float32_rows_depend_on_the_batch():
        return claim.batch_dependent
    return claim.value


def rendered(name: str, batch_dependent: bool = False) -> str:
    """The value as the docs write it: 0.45, 1e-5, 5e-8."""
    v = TOLERANCES[name].batch_dependent if batch_dependent else TOLERANCES[name].value
    if v >= 0.01:
        return f"{v:g}"
    mantissa, exponent = f"{v:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
