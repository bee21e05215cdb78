"""The audit's one error type for bad input (pure Python: the calling process and the ranks both raise it)."""


class AuditInputError(ValueError):
    """The audit cannot run what it was given: a factory that cannot be imported, or that returns the
    wrong type, or a bad option. The message names the bad value and the fix. (CLI exit code 2.)

    Raised in the calling process before any world starts; a rank that finds bad input (a factory returning
    something else there) reports the message in its record (``input_error``) and the audit raises it."""
