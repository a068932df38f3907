"""Error classes. Each class has its own exit code so scripts can tell failures apart."""


class KldError(Exception):
    """A failure we can explain to the user in one line."""

    exit_code = 1


class UsageError(KldError):
    """Wrong or contradictory flags."""

    exit_code = 2


class BaseFileError(KldError):
    """A base file that is not one, is truncated, corrupt or incomplete."""

    exit_code = 3


class MismatchError(KldError):
    """Model and base file do not belong together (vocabulary, tokenizer, context)."""

    exit_code = 4


class CorpusError(KldError):
    """Text that cannot be used: missing, empty, undecodable or too short."""

    exit_code = 5


class EngineError(KldError):
    """An engine could not load the model or evaluate tokens."""

    exit_code = 6


class OutputError(KldError):
    """An output file could not be written (full disk, permissions)."""

    exit_code = 7


class StateError(KldError):
    """A compare state file (checkpoint or shard) that is unreadable or does not fit the run."""

    exit_code = 8


# Finer classes: a sweep script can tell a file to rebuild from a model to replace from a text
# to fix. Each keeps its family's base class, so callers can still catch the family.


class NotABaseFile(BaseFileError):
    """Wrong magic, an unsupported container version, header numbers no run could produce."""

    exit_code = 10


class TruncatedHeader(BaseFileError):
    """Empty, or cut inside the header or the token table."""

    exit_code = 11


class TruncatedRows(BaseFileError):
    """Fewer rows than the header promises (llama-perplexity leaves these when interrupted)."""

    exit_code = 12


class RowLayoutError(BaseFileError):
    """Bytes that are not whole rows of n_ctx and n_vocab (extra bytes, wrong decoded size)."""

    exit_code = 13


class CorruptData(BaseFileError):
    """A zstd frame, the index, its checksum or a token id that cannot be right."""

    exit_code = 14


class MetadataError(BaseFileError):
    """Container metadata that is intact (checksum holds) but does not parse."""

    exit_code = 15


class IncompleteFile(BaseFileError):
    """A container without its completion marker: the run writing it did not finish."""

    exit_code = 16


class VocabMismatch(MismatchError):
    exit_code = 20


class TokenizerMismatch(MismatchError):
    """Different token texts, or a different BOS rule, than the base model's."""

    exit_code = 21


class ContextTooLong(MismatchError):
    """Chunks longer than the model's trained context."""

    exit_code = 22


class HeadMismatch(MismatchError):
    """An external output head (``base --head external``) whose hash is not the file's."""

    exit_code = 23


class TextTooShort(CorpusError):
    exit_code = 30


class EmptyText(CorpusError):
    exit_code = 31


class UndecodableText(CorpusError):
    exit_code = 32


class ReplayMismatch(EngineError):
    """A hidden-state base file would not reproduce the engine's logits: no file is written."""

    exit_code = 60


class AccessDenied(EngineError):
    """A server refused the request's key (HTTP 401 or 403)."""

    exit_code = 61
