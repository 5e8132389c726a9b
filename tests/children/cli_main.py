"""`nrl-shim` with argv[1:] as its command line, run as a plain program (not -m)."""

import sys

from nrl_shim.cli import main

sys.exit(main(sys.argv[1:]))
