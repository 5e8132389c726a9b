"""`nrl-shim doctor | run | explain`."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nrl-shim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, effective settings, which fixes apply here")
    sub.add_parser("run", help="run a command with the shim active in it and all its children")
    sub.add_parser("explain", help="show what the shim changes in a real vLLM engine config", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "explain":
        from .explain import main as explain_main

        return explain_main(rest)
    raise SystemExit(f"nrl-shim: {args.command} is not implemented yet")


if __name__ == "__main__":
    sys.exit(main())
