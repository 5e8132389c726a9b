"""argparse for every nrl-shim subcommand: a bad command line is one line naming what is wrong, exit status 2."""

import argparse

EXIT_USAGE = 2


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad command lines get one line naming what is wrong, and exit status 2 (no usage dump, no traceback)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
