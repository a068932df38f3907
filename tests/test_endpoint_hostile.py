"""`compare --endpoint` and `base --endpoint` against servers that answer wrongly: a stand-in HTTP
server on 127.0.0.1 (a remote host that misbehaves cannot be had here otherwise) answering what
a broken or hostile server could. Each run ends in one line naming the server (and the window
and position where an answer is at fault), exit 6 (a refused key: 61), no traceback, no file,
the key never printed and no control byte on the terminal (issue 79)."""

import pytest

from conftest import WIKI, run_cli
from helpers.endpoint_stand import KEY, stand_in

pytestmark = pytest.mark.quick


WRONG = [
    ("models", "/v1/models: no model list (not an OpenAI-compatible server?)"),
    ("nan", "the answer holds values that are not log-probs"),
    ("positive", "the answer holds values that are not log-probs"),
    ("ids", "the answer names token ids outside the vocabulary"),
    ("deep", "the answer is not JSON"),
    ("short", "prompt log-probs for a prompt of 128 tokens (truncated?)"),
    ("dup", "position 1: the answer names token 0 more than once"),
    ("mass", "position 1: the top"),  # ... K log-probs sum to a probability of K, above 1
    ("huge", "position 1: the answer holds a number too large for a log-prob"),
    ("disagree", "is outside the top "),  # ... K with a log-prob above the Kth's
    ("auth", "HTTP 401: Incorrect API key provided: *** \\x1b[31mdenied\\x1b[0m"),
]
# base --endpoint reads answers through the same client and checks: the answers whose checks are new
BASE_WRONG = ("nan", "dup", "mass", "huge", "disagree", "auth")


@pytest.mark.parametrize(
    "command, bad, says",
    [("compare", b, w) for b, w in WRONG]
    + [pytest.param("base", b, w, marks=pytest.mark.full_tier) for b, w in WRONG if b in BASE_WRONG],
)
def test_a_server_that_answers_wrongly_is_one_line(fp32_dir, hf_base, tmp_path, command, bad, says):
    out = tmp_path / "out"
    out.mkdir()
    with stand_in(bad, str(fp32_dir)) as url:
        if command == "compare":
            args = ("compare", "--kl-divergence-base", hf_base, "--chunks", 1, "--json", out / "r.json")
        else:
            args = ("base", "-f", WIKI, "-c", 128, "--chunks", 1, "--keep", "top-16", "--kl-divergence-base",
                    out / "b.kldt", "-m", fp32_dir)  # fmt: skip
        p = run_cli(
            *args, "--endpoint", url, check_rc=61 if bad == "auth" else 6, env_extra={"KLDTOOL_ENDPOINT_KEY": KEY}
        )
    lines = [line for line in p.stderr.strip().splitlines() if not line.startswith(f"{command}:")]
    assert len(lines) == 1 and lines[0].startswith(f"kldtool: error: {url}") and says in lines[0], lines
    if bad == "mass":
        assert "log-probs sum to a probability of 16.0000, above 1" in lines[0] or "of 20.0000, above 1" in lines[0]
    if bad == "disagree":
        assert "with a log-prob above the 16th's" in lines[0] or "above the 20th's" in lines[0]
    if bad not in ("models", "deep", "auth"):
        assert "window 0" in lines[0] or bad == "short", lines[0]
    assert "Traceback" not in p.stderr and not list(out.iterdir())
    assert KEY not in p.stdout + p.stderr and "\x1b" not in p.stdout + p.stderr
