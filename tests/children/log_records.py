"""A logging handler that keeps what the `nrl_shim` logger says, for child programs that report it as JSON."""

import logging


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []  # (level name, message)

    def emit(self, record):
        self.messages.append((record.levelname, record.getMessage()))


def error_line(exc):
    """`Type: message | Type | Cause | ...`: the error and the chain under it (an engine wraps the shim's error)."""
    line, cause = f"{type(exc).__name__}: {exc}", exc
    while cause is not None:
        line += f" | {type(cause).__name__}"
        cause = cause.__cause__ or cause.__context__
    return line
