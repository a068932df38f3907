"""Put this directory on PYTHONPATH of a test's child process that runs Triton kernels under
Triton's CPU interpreter (TRITON_INTERPRET=1); elsewhere it does nothing.

The interpreter re-patches ``triton.language`` on every call of a ``@triton.jit`` helper
(InterpretedFunction.__call__ -> _patch_lang walks the language modules' members each time, and
never restores what it set), and triton.language's own max, min, sum and zeros are such helpers.
Nothing is restored before a kernel's launch (GridExecutor.__call__) ends, and a patch does not
wrap what an earlier one wrapped, so within a launch every patch after the first for the same
module's globals changes nothing: profiled on the reducer's rows, those repeats were 45 % of the
interpreter's time. This skips them; each launch starts afresh, and kernels run unchanged.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton.runtime import interpreter
    except ImportError:  # no Triton here: nothing to speed up
        interpreter = None
    if interpreter is not None and all(
        hasattr(interpreter, n) for n in ("_patch_lang", "GridExecutor", "_LangPatchScope")
    ):
        _launches: list[set] = []  # per running launch: the module globals already patched for
        _patch_lang = interpreter._patch_lang
        _launch = interpreter.GridExecutor.__call__

        def _patch_unless_repeat(fn):
            if _launches and id(fn.__globals__) in _launches[-1]:
                return interpreter._LangPatchScope()  # sets nothing, restores nothing
            if _launches:
                _launches[-1].add(id(fn.__globals__))
            return _patch_lang(fn)

        def _launch_afresh(self, *args, **kwargs):
            _launches.append(set())
            try:
                return _launch(self, *args, **kwargs)
            finally:
                _launches.pop()

        interpreter._patch_lang = _patch_unless_repeat
        interpreter.GridExecutor.__call__ = _launch_afresh
