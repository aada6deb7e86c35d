"""Errors that reach the user.

A :class:`PerflabError` means the input was wrong (a bad flag, an unreadable trace, a spec with an
unknown key). The CLI prints its message as one line on stderr and exits with status 2. Failures of a
*measurement* (an OOM, a crashed case) are not errors of this kind: they become result rows with a
status, so that the other cases still run.
"""


class PerflabError(Exception):
    """Bad input. The message says what was wrong and how to fix it, in one line."""

    exit_code = 2


class ModelLoadError(PerflabError):
    """A user's model could not be imported or built (a missing file, an import that fails, a factory that raises).
    On the command line it is bad input like any other; in a sweep worker it is that case's ``error`` row, since
    the same reference may import on the driver and not on a worker."""


class CudaContextLost(PerflabError):
    """A case left the CUDA context unusable (a device-side assert, an illegal memory access: CUDA errors that stick
    to the process), so no further case can run in this process. ``rows``: the rows measured so far, the failed
    case's last; callers print and store them, then this one line. Not bad input: exit status 1."""

    exit_code = 1

    def __init__(self, message: str, rows: list | None = None):
        super().__init__(message)
        self.rows = rows or []
