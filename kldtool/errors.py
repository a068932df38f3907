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
