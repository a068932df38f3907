"""The llama.cpp compare path stays on numpy: llama.cpp's logits buffer and the base file's
rows go to the compiled reducer as arrays. Importing torch alone costs ~2 s, 8 % of a
20-chunk compare that llama-perplexity runs in ~25 s on this machine."""

from conftest import FIXTURES, chunk_table_lines, run_cli


def test_llamacpp_compare_never_imports_torch(q4_1_gguf, fixture_base):
    p = run_cli(
        "compare",
        "--kl-divergence-base",
        fixture_base,
        "-m",
        q4_1_gguf,
        "--chunks",
        1,
        env_extra={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    imported = {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "kldtool.reduce.numba_cpu" in imported and "llama_cpp" in imported
    assert "torch" not in imported
    # the same first chunk as llama-perplexity's own printed table
    assert chunk_table_lines(p.stdout)[0] == chunk_table_lines((FIXTURES / "compare-self.txt").read_text())[0]
