"""A logging handler that keeps what the `nrl_shim` logger says, for child programs that report it as JSON."""

import logging


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []  # (level name, message)

    def emit(self, record):
        self.messages.append((record.levelname, record.getMessage()))
