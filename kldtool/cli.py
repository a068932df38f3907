"""The ``kldtool`` command line. Thin: parse flags, call the pipeline, turn known failures
into one-line messages with a distinct exit code per class (see kldtool.errors)."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Optional

import typer

from kldtool.errors import KldError, UsageError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Measure how far a quantized model's predictions drift from its base model "
         "(llama-perplexity --kl-divergence compatible).",
)

ModelOpt = typer.Option(None, "-m", "--model", help="Model: a .gguf file (llamacpp) or a transformers directory. "
                                                    "Default: the built-in SmolLM2-135M.")
EngineOpt = typer.Option(None, "--engine", help="transformers, llamacpp or vllm (default: from the model path; .gguf -> llamacpp).")
DtypeOpt = typer.Option(None, "--dtype", help="transformers: float32 (default), bfloat16 or float16.")
DeviceOpt = typer.Option(None, "--device", help="transformers: cpu (default), cuda, cuda:N.")
ThreadsOpt = typer.Option(None, "-t", "--threads", help="CPU threads (default: all cores).")
BatchOpt = typer.Option(2048, "-b", "--batch-size", help="Tokens per engine call; chunks are batched as "
                                                         "llama-perplexity's n_seq = batch / ctx.")


TpOpt = typer.Option(None, "--tensor-parallel-size", help="vLLM: tensor-parallel ranks.")
GpuMemOpt = typer.Option(None, "--gpu-memory-utilization", help="vLLM: memory share it may reserve (CPU default 0.3).")
MaxLenOpt = typer.Option(None, "--max-model-len", help="vLLM: context length (default: the window + 1).")
QuantOpt = typer.Option(None, "--quantization", help="vLLM: quantization method (default: from the checkpoint).")
KvOpt = typer.Option(None, "--kv-cache-dtype", help="vLLM: KV-cache dtype.")
EagerOpt = typer.Option(False, "--enforce-eager", help="vLLM: no CUDA graphs / compilation.")
RemoteOpt = typer.Option(False, "--trust-remote-code", help="vLLM: allow the model's own code.")
VllmArgOpt = typer.Option(None, "--vllm-arg", help="vLLM: any other LLM(...) argument, KEY=VALUE (repeatable).")
BootOpt = typer.Option(1000, "--bootstrap", help="Block-bootstrap resamples over chunks for the error bars (0: none).")
SeedOpt = typer.Option(0, "--seed", help="Seed of the bootstrap's resampling.")


def _bootstrap(resamples: int, seed: int):
    from kldtool.stats.bootstrap import Bootstrap

    if resamples < 0:
        raise UsageError(f"--bootstrap {resamples}: must be 0 (none) or more")
    return Bootstrap(resamples, seed)


def _engine(n_ctx, engine, model, dtype, device, threads, batch, tp=None, gpu_mem=None, max_len=None, quant=None,
            kv_dtype=None, eager=False, remote=False, vllm_arg=None):
    from kldtool.engines import EngineOptions, make_engine
    from kldtool.engines.vllm import parse_vllm_args

    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: must be at least 1")
    if batch < 1:
        raise UsageError(f"--batch-size {batch}: must be at least 1")
    given = {"tensor_parallel_size": tp, "gpu_memory_utilization": gpu_mem, "max_model_len": max_len,
             "quantization": quant, "kv_cache_dtype": kv_dtype, "enforce_eager": eager or None,
             "trust_remote_code": remote or None}
    vllm = {k: v for k, v in given.items() if v is not None}
    vllm.update(parse_vllm_args(vllm_arg or []))
    opts = EngineOptions(engine, model, dtype, device, threads, batch, vllm)
    return make_engine(opts, n_ctx)


ProtocolOpt = typer.Option("llamacpp", "--protocol", help="llamacpp (chunks of -c, second half scored), exl3 "
                                                            "(windows of -c every --stride, all positions), stride "
                                                            "(Hugging Face's: each token once) or documents (--lengths).")
StrideOpt = typer.Option(None, "--stride", help="exl3/stride: tokens between window starts (default: -c / 4).")
LengthsOpt = typer.Option(None, "--lengths", help="documents: N,N,... first-N-token lengths (default: whole documents).")
CorpusFormatOpt = typer.Option("auto", "--corpus-format", help="text, lines (a document per line), jsonl, dir, tokens "
                                                              "(token strings) or ids (default: from -f).")
TextFieldOpt = typer.Option("text", "--text-field", help="jsonl: the field that holds a document's text.")
CtxOpt = typer.Option(None, "-c", "--ctx-size", help="llamacpp chunk / exl3, stride window (512).")
ChunksOpt = typer.Option(None, "--chunks", help="Use at most this many chunks (windows).")
LongOpt = typer.Option(False, "--force", help="Run windows longer than the model's trained context.")


def _protocol(name, ctx_size, stride, lengths):
    from kldtool.protocols import Protocol

    return Protocol.from_flags(name, ctx_size, stride, lengths)


def _longest(spec) -> int:
    """The window length engines are built for before the corpus is read (vLLM's max_model_len)."""
    return max(spec.n_ctx, max(spec.lengths, default=0)) or 8192


@app.command()
def base(
    model: Optional[str] = ModelOpt,
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Corpus (default: Python's built-in pydoc topics)."),
    corpus_format: str = CorpusFormatOpt,
    text_field: str = TextFieldOpt,
    protocol: str = ProtocolOpt,
    ctx_size: Optional[int] = CtxOpt,
    stride: Optional[int] = StrideOpt,
    lengths: Optional[str] = LengthsOpt,
    chunks: Optional[int] = ChunksOpt,
    force: bool = LongOpt,
    out: Optional[str] = typer.Option(None, "--kl-divergence-base", "--save-all-logits",
                                      help="Write the base file here (without it: perplexity only)."),
    fmt: str = typer.Option("kldtool", "--format", help="kldtool (compressed container) or llamacpp (raw, for llama-perplexity)."),
    codec: Optional[str] = typer.Option(None, "--codec", help="Row rounding: llamacpp (llama-perplexity's, default for "
                                                              "--format llamacpp) or grid (2^-12 steps, exact for bf16 logits; default otherwise)."),
    keep: Optional[str] = typer.Option(None, "--keep", help="top-K: store only each position's K most probable "
                                                            "entries and the rest's mass (kldtool format; ~V/3K "
                                                            "times smaller; KLD then a lower bound, see docs/metrics.md)."),
    clamp: float = typer.Option(16.0, "--clamp", help="Nats below each row's top that the stored codes span "
                                                      "(16..64; kldtool format beyond 16, as llama.cpp's layout "
                                                      "holds 16); KLD counts the base entries above -clamp."),
    engine: Optional[str] = EngineOpt,
    dtype: Optional[str] = DtypeOpt,
    device: Optional[str] = DeviceOpt,
    threads: Optional[int] = ThreadsOpt,
    batch: int = BatchOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the result as JSON here."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run that left the base file's "
                                                        "hidden partial beside it (same flags)."),
    tp: Optional[int] = TpOpt, gpu_mem: Optional[float] = GpuMemOpt, max_len: Optional[int] = MaxLenOpt,
    quant: Optional[str] = QuantOpt, kv_dtype: Optional[str] = KvOpt, eager: bool = EagerOpt,
    remote: bool = RemoteOpt, vllm_arg: Optional[list[str]] = VllmArgOpt,
):
    """Phase 1: run the base model over a text, print its PPL and store its log-probs."""
    from kldtool.codec import CODECS, check_clamp
    from kldtool.corpus import open_corpus
    from kldtool.logitsfile import FORMATS, check_layout
    from kldtool.pipeline import run_base
    from kldtool.pipeline.common import write_json

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if codec is not None and codec not in CODECS:
        raise UsageError(f"--codec {codec!r}: expected one of {', '.join(CODECS)}")
    from kldtool.topk import keep_of

    spec = _protocol(protocol, ctx_size, stride, lengths)
    top = keep_of(keep)
    try:
        clamp = check_clamp(clamp)
    except ValueError as e:
        raise UsageError(f"--clamp: {e}") from None
    check_layout(fmt, spec.name, top, clamp)  # before the model loads
    corpus = open_corpus(file, corpus_format, text_field)
    eng = _engine(_longest(spec), engine, model, dtype, device, threads, batch, tp, gpu_mem, max_len, quant, kv_dtype,
                  eager, remote, vllm_arg)
    try:
        if resume and not out:
            raise UsageError("--resume needs --kl-divergence-base FILE (the base file to continue)")
        result = run_base(eng, corpus, spec, chunks, out, fmt, codec=codec, resume=resume, force=force, keep=top,
                          clamp=clamp)
    finally:
        eng.close()
    if json_out:
        write_json(json_out, result)


@app.command()
def ppl(
    models: Optional[list[str]] = typer.Option(None, "-m", "--model", help="Model (repeat for a checkpoint sweep: one "
                                                                        "table). Default: the built-in SmolLM2-135M."),
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Corpus (default: Python's built-in pydoc topics)."),
    corpus_format: str = CorpusFormatOpt,
    text_field: str = TextFieldOpt,
    protocol: str = ProtocolOpt,
    ctx_size: Optional[int] = CtxOpt,
    stride: Optional[int] = StrideOpt,
    lengths: Optional[str] = LengthsOpt,
    chunks: Optional[int] = ChunksOpt,
    engine: Optional[str] = EngineOpt,
    dtype: Optional[str] = DtypeOpt,
    device: Optional[str] = DeviceOpt,
    threads: Optional[int] = ThreadsOpt,
    batch: int = BatchOpt,
    force: bool = LongOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the result(s) as JSON here."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write the models' table as CSV here."),
    plot: Optional[str] = typer.Option(None, "--plot", help="documents with --lengths: PNG of PPL vs length here."),
    tp: Optional[int] = TpOpt, gpu_mem: Optional[float] = GpuMemOpt, max_len: Optional[int] = MaxLenOpt,
    quant: Optional[str] = QuantOpt, kv_dtype: Optional[str] = KvOpt, eager: bool = EagerOpt,
    remote: bool = RemoteOpt, vllm_arg: Optional[list[str]] = VllmArgOpt,
):
    """Score mode: a model's perplexity under any protocol, without a base file."""
    from kldtool.corpus import open_corpus
    from kldtool.pipeline.common import write_json, write_text
    from kldtool.pipeline.ppl import run_ppl
    from kldtool.report.ppl_table import csv_text, print_table

    spec = _protocol(protocol, ctx_size, stride, lengths)
    if plot and not spec.lengths:
        raise UsageError("--plot draws PPL against --lengths: give --protocol documents --lengths N,N,...")
    corpus = open_corpus(file, corpus_format, text_field)
    results = []
    for m in models or [None]:
        eng = _engine(_longest(spec), engine, m, dtype, device, threads, batch, tp,
                      gpu_mem, max_len, quant, kv_dtype, eager, remote, vllm_arg)
        try:
            results.append(run_ppl(eng, corpus, spec, chunks, force=force))
        finally:
            eng.close()
    if len(results) > 1:
        print_table(results)
    if json_out:
        write_json(json_out, results[0] if len(results) == 1 else {"runs": results})
    if csv_out:
        write_text(csv_out, csv_text(results))
    if plot:
        from kldtool.report.plots import ppl_vs_length

        ppl_vs_length(results, plot)


@app.command()
def compare(
    base_file: Optional[str] = typer.Option(None, "--kl-divergence-base", "--save-all-logits",
                                            help="Base file written by `kldtool base` or llama-perplexity."),
    model: Optional[str] = ModelOpt,
    kl_divergence: bool = typer.Option(False, "--kl-divergence", help="Accepted for llama-perplexity familiarity; always on."),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help="Must match the base file if given."),
    protocol: Optional[str] = typer.Option(None, "--protocol", help="Must match the base file if given (it is "
                                                                    "taken from the file)."),
    stride: Optional[int] = typer.Option(None, "--stride", help="Must match the base file if given."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Must match the base file if given."),
    file: Optional[str] = typer.Option(None, "-f", "--file", help="Ignored: the tokens come from the base file."),
    engine: Optional[str] = EngineOpt,
    dtype: Optional[str] = DtypeOpt,
    device: Optional[str] = DeviceOpt,
    threads: Optional[int] = ThreadsOpt,
    batch: int = BatchOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every statistic and the run's metadata here."),
    force: bool = typer.Option(False, "--force", help="Compare even when the tokenizer or BOS policy differ, or the chunks exceed the model's trained context (noted in every output)."),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    chunk_range: Optional[str] = typer.Option(None, "--chunk-range", help="Use chunks A:B only (0-based, end excluded: "
                                                                          "printed as A+1..B); for shards, see `merge`."),
    state: Optional[str] = typer.Option(None, "--state", help="Checkpoint the accumulators here (atomically) while "
                                                              "running and at the end; a shard for `kldtool merge`."),
    checkpoint_every: Optional[str] = typer.Option(None, "--checkpoint-every", help="With --state: every N chunks "
                                                                                    "(10) or seconds (60s, default)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the --state checkpoint (if there is one)."),
    per_token: Optional[str] = typer.Option(None, "--per-token", help="Write every scored token's values "
                                                                      "(nll, KLD, Δp, same top...) to this HDF5 file."),
    resamples: int = BootOpt, seed: int = SeedOpt,
    noise_floor: Optional[str] = typer.Option(None, "--noise-floor", help="A `kldtool noise-floor --json` result "
                                                                          "of this base file: also print the mean "
                                                                          "KLD as a multiple of that floor."),
    tp: Optional[int] = TpOpt, gpu_mem: Optional[float] = GpuMemOpt, max_len: Optional[int] = MaxLenOpt,
    quant: Optional[str] = QuantOpt, kv_dtype: Optional[str] = KvOpt, eager: bool = EagerOpt,
    remote: bool = RemoteOpt, vllm_arg: Optional[list[str]] = VllmArgOpt,
):
    """Phase 2: run a model over a base file's tokens and print llama-perplexity's KLD statistics."""
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline import run_compare
    from kldtool.pipeline.compare import Checkpoints, check_protocol_flags, parse_chunk_range

    del kl_divergence
    if base_file is None:
        raise UsageError("compare needs --kl-divergence-base FILE (written by `kldtool base` or llama-perplexity)")
    checkpoints = Checkpoints.parse(state, checkpoint_every, resume)
    boot = _bootstrap(resamples, seed)
    reader = open_base_file(base_file)
    try:
        from kldtool.pipeline.noise_floor import load_floor

        floor = load_floor(noise_floor, reader) if noise_floor else None
        check_protocol_flags(reader, protocol, ctx_size, stride, lengths)
        span = parse_chunk_range(chunk_range, chunks, reader.header.n_chunk, base_file)
        if file is not None:
            print(f"note: -f {file} ignored: the tokens come from {base_file}", file=sys.stderr)
        eng = _engine(reader.header.n_ctx, engine, model, dtype, device, threads, batch, tp, gpu_mem, max_len, quant,
                      kv_dtype, eager, remote, vllm_arg)
        try:
            run_compare(eng, reader, force=force, json_path=json_out, chunk_range=span, checkpoints=checkpoints,
                        per_token_path=per_token, bootstrap=boot, floor=floor)
        finally:
            eng.close()
    finally:
        reader.close()


@app.command("noise-floor")
def noise_floor_cmd(
    base_file: Optional[str] = typer.Option(None, "--kl-divergence-base", help="The base file (its model is the default -m)."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="The base model again (default: the one the base "
                                                                     "file names), run another valid way."),
    engine: Optional[str] = EngineOpt,
    dtype: Optional[str] = DtypeOpt,
    device: Optional[str] = DeviceOpt,
    threads: Optional[int] = ThreadsOpt,
    batch: int = BatchOpt,
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Use only the base file's first N chunks."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the floor here (for compare --noise-floor)."),
):
    """The base model against its own base file through another numeric path (dtype, batch size,
    device or engine): the KLD below which a quant cannot be told from the base."""
    from kldtool.logitsfile import open_base_file
    from kldtool.pipeline.compare import parse_chunk_range
    from kldtool.pipeline.noise_floor import run_noise_floor

    if base_file is None:
        raise UsageError("noise-floor needs --kl-divergence-base FILE")
    reader = open_base_file(base_file)
    try:
        named = reader.metadata.get("model", {}).get("model")
        if model is None and not named:
            raise UsageError(f"noise-floor: {base_file} does not name its model; give -m")
        span = parse_chunk_range(None, chunks, reader.header.n_chunk, base_file)
        eng = _engine(reader.header.n_ctx, engine, model or named, dtype, device, threads, batch)
        try:
            run_noise_floor(eng, reader, json_path=json_out, chunk_range=span)
        finally:
            eng.close()
    finally:
        reader.close()


@app.command()
def merge(
    states: list[str] = typer.Argument(..., help="State files of compare shards (compare --chunk-range A:B --state FILE)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write every statistic and the shards' metadata here."),
    force: bool = typer.Option(False, "--force", help="Merge shards even when their models' names differ."),
    resamples: int = BootOpt, seed: int = SeedOpt,
):
    """Combine compare shards into the statistics of one run over all their chunks."""
    from kldtool.pipeline.merge import run_merge

    run_merge(states, json_path=json_out, force=force, bootstrap=_bootstrap(resamples, seed))


@app.command()
def report(
    results: list[str] = typer.Argument(..., help="compare/merge --json results and compare --per-token .h5 files "
                                                  "(those of one model are pooled)."),
    markdown: Optional[str] = typer.Option(None, "--markdown", help="Write the table as Markdown here."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write the table as CSV (full precision) here."),
    plots: Optional[str] = typer.Option(None, "--plots", help="Write PNG plots into this directory."),
    title: Optional[str] = typer.Option(None, "--title", help="Title of the table and Markdown."),
    mix: bool = typer.Option(False, "--mix", help="Report results of different base files or protocols together."),
):
    """One table (and plots) for many quants compared against one base file, sorted by size."""
    from kldtool.pipeline.common import write_text
    from kldtool.report import table
    from kldtool.report.results import load_results

    rows = load_results(results, mix=mix)
    table.console(rows, title)
    if markdown:
        write_text(markdown, table.markdown(rows, title))
    if csv_out:
        write_text(csv_out, table.csv_text(rows))
    if plots:
        from kldtool.report.plots import write_plots

        for path in write_plots(rows, plots):
            print(f"report: wrote {path}", file=sys.stderr)


@app.command()
def quantize(
    src: str = typer.Argument(..., help="GGUF to quantize (F16/F32, or a quant: requantized)."),
    dst: str = typer.Argument(..., help="GGUF to write (atomically)."),
    type_name: str = typer.Argument(..., metavar="TYPE", help="llama.cpp type: Q8_0, Q6_K, Q4_K_M, Q2_K ..."),
    threads: Optional[int] = ThreadsOpt,
):
    """llama-quantize through llama-cpp-python, for sweeps."""
    from kldtool.gguf_tools import quantize as run_quantize
    from kldtool.sizes import model_size

    if not os.path.isfile(src):
        raise UsageError(f"{src}: no such GGUF file")
    run_quantize(src, dst, type_name, threads)
    size = model_size(dst)
    print(f"{src} -> {dst} ({type_name}, {size.file_bytes / 2**20:.1f} MiB, {size.bpw_linear:.3f} bpw)", file=sys.stderr)


@app.command()
def info(
    path: str = typer.Argument(..., help="A base file of either format."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
):
    """Show a base file's header, metadata, sizes and completeness."""
    from kldtool.codec import row_width
    from kldtool.logitsfile import open_base_file

    reader = open_base_file(path)
    try:
        h = reader.header
        raw_size = 20 + 4 * h.n_tokens + h.scored_tokens * row_width(h.n_vocab) * 2
        data = {
            "path": path, "format": reader.format_name, "complete": True,
            "protocol": reader.metadata.get("protocol", {}).get("name", "llamacpp"),
            "n_ctx": h.n_ctx, "n_vocab": h.n_vocab, "n_chunk": h.n_chunk, "keep": h.keep or "all",
            "clamp_nats": h.clamp,
            "rows_per_chunk": h.rows_per_chunk, "scored_tokens": h.scored_tokens,
            "file_bytes": reader.file_size, "raw_equivalent_bytes": raw_size,
            "ratio_to_raw": round(reader.file_size / raw_size, 4),
            "metadata": reader.metadata,
        }
    finally:
        reader.close()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for k, v in data.items():
        if k != "metadata":
            print(f"{k:22s}: {v}")
    print("metadata              :")
    print(json.dumps(data["metadata"], indent=2))


@app.command()
def convert(
    src: str = typer.Argument(..., help="Base file to read."),
    dst: str = typer.Argument(..., help="Base file to write."),
    to: Optional[str] = typer.Option(None, "--to", help="kldtool or llamacpp (default: the other format)."),
):
    """Convert a base file between llama.cpp's raw layout and the kldtool container (lossless)."""
    from kldtool.logitsfile import FORMATS, create_writer, iter_chunks, open_base_file

    reader = open_base_file(src)
    try:
        target = to or ("llamacpp" if reader.format_name == "kldtool" else "kldtool")
        if target not in FORMATS:
            raise UsageError(f"--to {target!r}: expected one of {', '.join(FORMATS)}")
        if os.path.abspath(src) == os.path.abspath(dst):
            raise UsageError(f"{dst}: is the input file; choose another output path")
        meta = dict(reader.metadata)
        meta.setdefault("converted_from", {"path": src, "format": reader.format_name})
        writer = create_writer(dst, target, reader.header, reader.tokens, meta)
        try:
            for _, rows in iter_chunks(reader, range(reader.header.n_chunk)):
                writer.write_chunk(rows)
            writer.finish()
        except BaseException:
            writer.abort()
            raise
    finally:
        reader.close()
    print(f"{src} ({reader.format_name}) -> {dst} ({target})", file=sys.stderr)


def _click_exceptions():
    # typer 0.2x vendors click as typer._click; earlier releases use click itself.
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def main(argv: list[str] | None = None) -> None:
    from kldtool.memory import pin_mmap_threshold

    pin_mmap_threshold()
    # A scheduler's SIGTERM gets the same orderly stop as Ctrl-C: checkpoints saved, partials kept.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cx = _click_exceptions()
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="kldtool")
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except cx.ClickException as e:
        e.show()
        sys.exit(UsageError.exit_code if e.exit_code == 2 else e.exit_code)
    except (KeyboardInterrupt, typer.Abort, getattr(cx, "Abort", typer.Abort)):
        print("kldtool: interrupted; no output file was completed", file=sys.stderr)
        sys.exit(130)
    except KldError as e:
        print(f"kldtool: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
