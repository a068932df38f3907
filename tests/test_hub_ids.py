"""Models named by hub id (org/name, --revision, org/name:file.gguf), resolved offline from a hub
cache built from the built-in model (tests/helpers/hub_cache.py): the same numbers as the local
paths behind them, the snapshot recorded in base files and results, and one-line errors that say
what was tried. vLLM by hub id: tests/test_vllm_engine.py (offline) and test_vllm_server.py
(a server started with the hub id)."""

from __future__ import annotations

import json

import pytest

from conftest import WIKI, compare_json, run_cli
from helpers.hub_cache import GGUF_REPO, GGUF_SNAPSHOT, MODEL, SNAPSHOTS

from kldtool.engines.defaults import GGUF_NAME

WINDOWS = ("-f", WIKI, "-c", 128, "--chunks", 3)


def ppl_of(tmp_path, hub_env, *args) -> dict:
    out = tmp_path / f"ppl-{len(list(tmp_path.glob('ppl-*.json')))}.json"
    run_cli("ppl", *args, *WINDOWS, "--json", out, env_extra=hub_env)
    return json.loads(out.read_text())


def one_line_error(hub_env, *args) -> str:
    p = run_cli(*args, check_rc=None, env_extra=hub_env)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_a_checkpoint_by_hub_id_base_compare_ppl_and_what_they_record(hub_env, fp32_dir, tmp_path):
    base = tmp_path / "hub.kldt"
    run_cli("base", "-m", MODEL, *WINDOWS, "--kl-divergence-base", base, env_extra=hub_env)
    from kldtool.logitsfile import open_base_file

    reader = open_base_file(str(base))
    recorded = reader.metadata["manifest"]["source"]
    assert reader.metadata["model"]["source"] == recorded
    reader.close()
    assert recorded == {"hub_id": MODEL, "revision": "main", "snapshot": SNAPSHOTS["main"]}

    # The tag v2 is another snapshot of the same files: the same numbers, another identity.
    main = compare_json(base, tmp_path, "-m", MODEL, env_extra=hub_env)
    v2 = compare_json(base, tmp_path, "-m", MODEL, "--revision", "v2", env_extra=hub_env)
    assert v2["manifest"]["source"] == {"hub_id": MODEL, "revision": "v2", "snapshot": SNAPSHOTS["v2"]}
    assert v2["model"]["model"].endswith(f"/models--someorg--smol/snapshots/{SNAPSHOTS['v2']}")
    assert v2["statistics"] == main["statistics"]
    for run in (main, v2):
        # the base rows are stored as uint16 codes: the model against itself is within their step
        assert abs(run["statistics"]["kld_mean"]["value"]) < 1e-5 and run["statistics"]["same_top_p"]["value"] == 1.0

    # report refuses one name at two snapshots, as it refuses other manifest mismatches.
    a, b = tmp_path / "main.json", tmp_path / "v2.json"
    a.write_text(json.dumps(main))
    b.write_text(json.dumps(v2))
    line = one_line_error(hub_env, "report", a, b)
    assert f"{MODEL} at revision v2 (snapshot {SNAPSHOTS['v2']})" in line and "--mix" in line
    run_cli("report", a, b, "--mix", env_extra=hub_env)

    # ppl by hub id is ppl of the directory behind it; a local model records its path and a hash.
    by_id, by_path = ppl_of(tmp_path, hub_env, "-m", MODEL), ppl_of(tmp_path, hub_env, "-m", fp32_dir)
    assert by_id["ppl"] == by_path["ppl"] and by_id["nll_sum"] == by_path["nll_sum"]
    local = by_path["manifest"]["source"]
    assert local["path"] == fp32_dir and len(local["content_sha256"]) == 64


def test_a_gguf_in_a_hub_repository(hub_env, q4_1_gguf, fixture_base, tmp_path):
    in_repo = f"{GGUF_REPO}:{GGUF_NAME}"
    by_id = compare_json(fixture_base, tmp_path, "-m", in_repo, "--chunks", 4, env_extra=hub_env)
    by_path = compare_json(fixture_base, tmp_path, "-m", q4_1_gguf, "--chunks", 4, env_extra=hub_env)
    assert by_id["statistics"] == by_path["statistics"]
    assert by_id["model"]["engine"] == "llamacpp"
    assert by_id["manifest"]["source"] == {
        "hub_id": GGUF_REPO,
        "revision": "main",
        "snapshot": GGUF_SNAPSHOT,
        "file": GGUF_NAME,
    }
    flag = ppl_of(tmp_path, hub_env, "-m", GGUF_REPO, "--gguf-file", GGUF_NAME)
    assert flag["manifest"]["source"] == by_id["manifest"]["source"]
    assert flag["ppl"] == ppl_of(tmp_path, hub_env, "-m", q4_1_gguf)["ppl"]


@pytest.mark.quick
def test_what_cannot_be_found_is_one_line_naming_what_was_tried(hub_env, fp32_dir, tmp_path):
    cache = hub_env["HF_HUB_CACHE"]
    line = one_line_error(hub_env, "ppl", "-m", "someorg/missing", *WINDOWS)
    assert line == (
        f"kldtool: error: someorg/missing: no such model (not a local path; the hub cache {cache} has no "
        f"someorg/missing; the network is off (HF_HUB_OFFLINE=1))"
    )
    line = one_line_error(hub_env, "ppl", "-m", MODEL, "--revision", "v9", *WINDOWS)
    assert "the hub cache has someorg/smol but not its revision v9" in line
    line = one_line_error(hub_env, "ppl", "-m", GGUF_REPO, "--gguf-file", "other.gguf", *WINDOWS)
    assert f"the hub cache's {GGUF_REPO}@main has no other.gguf" in line
    line = one_line_error(hub_env, "ppl", "-m", fp32_dir, "--revision", "v2", *WINDOWS)
    assert line.endswith(f"--revision: only with a hub id (org/name); {fp32_dir} is a local path")
    line = one_line_error(hub_env, "ppl", "-m", "models/here/smol", *WINDOWS)
    assert line.endswith("models/here/smol: no such file or directory, and not a hub id (org/name)")


def test_an_external_head_found_by_hub_id(hub_env, tmp_path):
    """A hidden-state file whose head stays in the base model: --head-from names that model by
    hub id (the GGUF in the hub cache) and compare prints what it prints with the head's own path."""
    ext = tmp_path / "external.kldt"
    run_cli("base", *WINDOWS, "--store", "hidden", "--head", "external", "--kl-divergence-base", ext)
    args = ("compare", "-m", f"{GGUF_REPO}:{GGUF_NAME}", "--kl-divergence-base", ext)
    by_path = run_cli(*args, env_extra=hub_env).stdout
    by_id = run_cli(*args, "--head-from", f"{GGUF_REPO}:{GGUF_NAME}", env_extra=hub_env).stdout
    assert by_id == by_path and "Mean    KLD" in by_id
