"""Chat prompts rendered with a model's own chat template, as transformers' ``apply_chat_template``
renders them: Jinja in a sandbox, blocks trimmed, the same helpers (``raise_exception``,
``strftime_now``, a ``tojson`` that keeps non-ASCII text) and the tokenizer's special tokens by
name. One renderer for every engine: a GGUF's ``tokenizer.chat_template`` goes through it too, not
through llama.cpp's built-in templates (which recognise a family and drop what the template adds,
such as a default system prompt), so two engines of one model see one prompt.

A template comes from a file a user names or from a model's files: it runs sandboxed, and a
failure to render is a one-line error naming the prompt."""

from __future__ import annotations

import datetime
import hashlib
import json

from kldtool.errors import UsageError


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}…{% endgeneration %}`` (transformers marks assistant text with it):
        rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    """A compiled template and the special tokens it is rendered with (``bos_token``,
    ``eos_token``, …: what the model's tokenizer names them)."""

    def __init__(self, source: str, special: dict[str, str], where: str):
        import jinja2

        self.source, self.special, self.where = source, dict(special), where
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            raise UsageError(f"{where}: not a chat template Jinja can read ({e})") from None

    def render(self, messages: list[dict], where: str) -> str:
        """The prompt text of ``messages`` with the assistant's turn opened."""
        import jinja2

        try:
            return self._template.render(messages=messages, add_generation_prompt=True, **self.special)
        except (jinja2.TemplateError, TypeError, ValueError) as e:
            raise UsageError(f"{where}: the chat template ({self.where}) failed to render it: {e}") from None
