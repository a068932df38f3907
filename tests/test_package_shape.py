"""The package's layering, read from its source: no import cycle (imports inside functions
count: they are cycles deferred, not avoided), the codec beneath the reducer, results beside
the run layer rather than under it, engines beneath the pipeline, provenance beneath the
engines, a package root that holds little, and modules, CLI modules and functions small
enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

PKG = Path(__file__).resolve().parent.parent / "kldtool"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """kldtool modules that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            for a in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_graph_is_read():
    graph = _graph()
    assert "kldtool.codec.rows" in graph["kldtool.reduce.rowmath"]
    assert "kldtool.reduce.numba_cpu" in graph["kldtool.reduce"]  # an import inside a function
    assert "kldtool.cli.runs" in graph["kldtool.cli"]


def test_no_import_cycle():
    graph = _graph()
    cycles = sorted(m for m in graph if m in _reachable(graph, m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_layers():
    graph = _graph()
    for mod in graph:
        if mod.startswith("kldtool.codec"):
            assert not any(m.startswith("kldtool.reduce") for m in _reachable(graph, mod)), mod
        if mod.startswith("kldtool.report"):
            assert not any(m.startswith("kldtool.pipeline") for m in _reachable(graph, mod)), mod
        if mod.startswith("kldtool.provenance"):  # the engines record their provenance, not the reverse
            assert not any(m.startswith("kldtool.engines") for m in graph[mod]), mod


def test_cli_modules_stay_small():
    for path in (PKG / "cli").glob("*.py"):
        assert len(path.read_text().splitlines()) <= 250, path.name


def test_no_module_is_long():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 350}
    assert not long, f"modules over 350 lines: {long}"


# Engine hooks only llama.cpp's schedule uses (engines/llamacpp/lanes.py): the runs see a schedule.
LANE_HOOKS = {"lanes", "lane_pieces", "set_threads", "LaneSchedule", "llamacpp_lanes"}


def test_lanes_stay_inside_the_engines():
    offenders = []
    for name, tree in _trees().items():
        if name.startswith("kldtool.engines"):
            continue
        for node in ast.walk(tree):
            # attributes (engine.lanes(...)), the schedule's class, imports of its module; not any
            # local variable that happens to be called lanes (the Triton kernel's lanes of a tile)
            named = (
                node.attr
                if isinstance(node, ast.Attribute)
                else node.id
                if isinstance(node, ast.Name) and node.id == "LaneSchedule"
                else node.module
                if isinstance(node, ast.ImportFrom)
                else None
            )
            if named and named.rpartition(".")[2] in LANE_HOOKS:
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, f"lane hooks outside kldtool/engines/: {offenders}"


READERS = (
    "kldtool.logitsfile",
    "kldtool.logitsfile.container_reader",
    "kldtool.logitsfile.raw",
    "kldtool.logitsfile.reader_base",
    "kldtool.logitsfile.prefetch",
)


def test_report_renders_and_opens_no_base_file():
    """report/ renders what analysis/ computed: no module of it reaches a base-file reader."""
    graph = _graph()
    for mod in graph:
        if mod.startswith("kldtool.report"):
            reached = _reachable(graph, mod) & set(READERS)
            assert not reached, f"{mod} reaches {sorted(reached)}"


# --- the vLLM seam: kldtool touches vLLM in one package, and only through what SEAM lists -----

SEAM_DIR = PKG / "engines" / "vllm" / "seam"
# Attribute names the seam uses that are not vLLM's: Python's, torch's, transformers' config,
# and kldtool's own marks and hook methods.
NOT_VLLM = {
    "__contains__",
    "__name__",
    "__version__",
    "get",
    "items",
    "pop",
    "join",
    "removeprefix",
    "getLogger",
    "error",
    "import_module",
    "tolist",
    "to",
    "dim",
    "is_floating_point",
    "weight",
    "bias",
    "type",
    "itemsize",
    "is_available",
    "is_initialized",
    "get_rank",
    "max_position_embeddings",
    "_kldtool",
    "_kldtool_hooked",
    "step",
    "sweep",
    "head_dtype",
}  # newer vLLMs' LogitsProcessor only: read with a default, so not a seam item
HANDLES = {"worker", "runner", "llm", "model_runner"}  # names other modules give vLLM's objects


def _trees():
    return {name: ast.parse(path.read_text(), str(path)) for name, path in _modules().items()}


def _is_vllm(module: str | None) -> bool:
    return bool(module) and (module == "vllm" or module.startswith("vllm."))


def test_only_the_seam_imports_vllm():
    offenders = []
    for name, tree in _trees().items():
        if name.startswith("kldtool.engines.vllm.seam"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(_is_vllm(a.name) for a in node.names):
                offenders.append(name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_vllm(node.module):
                offenders.append(name)
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and _is_vllm(str(node.args[0].value))
            ):
                offenders.append(name)
    assert not offenders, f"modules importing vLLM outside engines/vllm/seam/: {sorted(set(offenders))}"


def test_vllm_objects_stay_handles_outside_the_seam():
    """A worker, runner or LLM reaches other modules only to be handed back to the seam: no
    attribute of it is read there (nor of ``self`` in the worker extension vLLM mixes in)."""
    offenders = []
    for path in (PKG / "engines" / "vllm").glob("*.py"):  # the seam is a package of its own below
        tree = ast.parse(path.read_text())
        extension = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "KldtoolWorker"]
        selfish = {id(n) for c in extension for n in ast.walk(c)}
        for node in ast.walk(tree):
            base = (
                node.value
                if isinstance(node, ast.Attribute)
                else node.args[0]
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and node.args
                else None
            )
            if (
                isinstance(base, ast.Attribute)
                and isinstance(base.value, ast.Name)
                and base.value.id == "self"
                and base.attr in HANDLES
            ):
                base = ast.Name(id=base.attr)
            if isinstance(base, ast.Name) and (base.id in HANDLES or (base.id == "self" and id(node) in selfish)):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"vLLM objects read outside the seam: {offenders}"


def test_every_vllm_attribute_the_seam_uses_is_in_the_seam_list():
    """What the seam reads of vLLM's objects is what SEAM lists, so scripts/vllm_seam_check.py
    checks a new vLLM release for all of it."""
    from kldtool.engines.vllm.seam import SEAM

    used = set()
    for path in SEAM_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        used |= {
            n.args[1].value
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
            and getattr(n.func, "id", None) in ("getattr", "hasattr", "setattr")
            and len(n.args) > 1
            and isinstance(n.args[1], ast.Constant)
        }
    unlisted = used - {item[2] for item in SEAM} - NOT_VLLM
    assert not unlisted, f"vLLM attributes the seam uses but SEAM does not list: {sorted(unlisted)}"


def test_the_package_root_holds_little():
    """The entry point and the error classes; every concept lives in a package named for it."""
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= 4, f"modules at the package root: {root}"


def test_engines_never_import_the_pipeline():
    modules = _modules()
    wrong = {
        name: sorted(m for m in _imports(name, path, modules) if m.startswith("kldtool.pipeline"))
        for name, path in modules.items()
        if name.startswith("kldtool.engines")
    }
    assert not {k: v for k, v in wrong.items() if v}


# The one exception: the Triton reducer is one compiled kernel whose split into jitted helpers
# could only be checked by compiling it on a GPU (the CPU suite runs it in Triton's interpreter).
LONG_FUNCTIONS_ALLOWED = {"kldtool/reduce/triton_kernel.py:_reduce_kernel"}


def test_no_function_is_long():
    """At most 60 lines from a function's first statement to its end (a typer command's
    signature of flags is not counted)."""
    long = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{path.relative_to(PKG.parent)}:{node.name}"
                length = node.end_lineno - node.body[0].lineno + 1
                if length > 60 and where not in LONG_FUNCTIONS_ALLOWED:
                    long[where] = length
    assert not long, f"functions over 60 lines: {long}"


def test_a_dataclass_of_more_than_four_fields_is_keyword_only():
    """Five or more fields passed by position let two of one type trade places unseen."""
    loose = []
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for d in node.decorator_list:
                call = d if isinstance(d, ast.Call) else None
                if getattr(call.func if call else d, "id", None) != "dataclass":
                    continue
                fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and "ClassVar" not in ast.unparse(s)]
                kw_only = call is not None and any(k.arg == "kw_only" for k in call.keywords)
                if len(fields) > 4 and not kw_only:
                    loose.append(f"{name}.{node.name} ({len(fields)} fields)")
    assert not loose, f"dataclasses without kw_only=True: {loose}"


# An engine's tools that the rest of kldtool uses directly, each at the one place that needs it:
# the module that imports it -> the engine folder it imports from.
ENGINE_TOOLS = {
    "kldtool.cli.files": "llamacpp",  # `kldtool quantize`: llama-quantize
    "kldtool.analysis.worst": "llamacpp",  # a GGUF's vocabulary, without its weights
    "kldtool.pipeline.checkpoint_sweep": "xlstm",  # a helibrunna run's checkpoints
    "kldtool.pipeline.merge": "endpoint",  # what a merged endpoint run knows only as a bound
    "kldtool.recipe.llamacpp_builds": "llamacpp",  # `kldtool recipe`: llama-quantize
    "kldtool.recipe.routing_flips": "transformers",  # `kldtool recipe`'s forward is transformers' model
}


def test_only_an_engines_folder_names_its_modules():
    """Outside ``engines/<name>/`` no module imports or names ``kldtool.engines.<name>``, but for
    the engine tools ``ENGINE_TOOLS`` lists: the rest of kldtool reaches an engine through the
    registry (its PACKAGES names each folder once), so an engine is added in its folder alone."""
    from kldtool.engines.registry import PACKAGES

    offenders = []
    for name, tree in _trees().items():
        own = next(
            (p for p in PACKAGES if name == f"kldtool.engines.{p}" or name.startswith(f"kldtool.engines.{p}.")), None
        )
        for node in ast.walk(tree):
            named = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                named = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = [node.value.partition(":")[0]]
            for n in named:
                for p in PACKAGES:
                    tool = ENGINE_TOOLS.get(name) == p
                    if p != own and not tool and (n == f"kldtool.engines.{p}" or n.startswith(f"kldtool.engines.{p}.")):
                        offenders.append(f"{name}:{node.lineno}: {n}")
    assert not offenders, f"engine modules named outside their folder: {sorted(set(offenders))}"


def test_runs_take_a_job_not_a_list_of_flags():
    """A run (``run_*`` and ``compare_files`` in pipeline/) takes at most 6 parameters: what
    the flags ask for travels as one frozen job (BaseJob, CompareJob, PplJob)."""
    wide = {}
    for path in (PKG / "pipeline").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and (node.name.startswith("run_") or node.name == "compare_files"):
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                if n > 6:
                    wide[f"{path.name}:{node.name}"] = n
    assert not wide, f"runs with more than 6 parameters: {wide}"


# The served hook's modules: what a vLLM worker runs for a request from the network.
HOOK_MODULES = ("worker.py", "delivery.py", "base_feeds.py", "policy.py", "plugin.py", "request_memory.py")
# Calls that open, create, rename or remove a file by its path name: os's, the builtin open,
# pathlib's methods and the atomic writer.
OS_PATH_CALLS = {"open", "replace", "rename", "renames", "unlink", "remove", "rmdir", "mkdir", "makedirs", "link",
                 "symlink", "mkfifo", "truncate"}  # fmt: skip
PATH_METHODS = {"open", "write_bytes", "write_text", "touch", "mkdir", "unlink", "rename", "symlink_to", "hardlink_to"}


def _path_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            bad = f.id in ("open", "AtomicFile", "PartialFile")
        elif isinstance(f, ast.Attribute):
            of_os = isinstance(f.value, ast.Name) and f.value.id == "os"
            bad = f.attr in OS_PATH_CALLS if of_os else f.attr in PATH_METHODS
        else:
            bad = False
        if bad:
            found.append(f"{path.name}:{node.lineno} {ast.unparse(f)}(...)")
    return found


def test_the_served_hook_touches_files_only_through_its_descriptors():
    """Issue 78: a path the hook checked is never resolved again. Its modules open, create,
    rename and remove files only through engines/vllm/confined.py, which does so relative to
    descriptors it holds (dir_fd=, O_NOFOLLOW, O_EXCL)."""
    vllm = PKG / "engines" / "vllm"
    assert _path_calls(vllm / "confined.py"), "the rule reads calls: confined.py makes them"
    found = [c for name in HOOK_MODULES for c in _path_calls(vllm / name)]
    assert not found, f"file calls by path in the served hook's modules: {found}"
