"""The parent imports nrl_shim explicitly (NRL_SHIM not set); a multiprocessing worker started with the method argv[1]
(spawn, forkserver or fork) reports on itself. A file, not -c: spawn/forkserver children re-import the parent's
__main__."""

import json
import multiprocessing as mp
import sys

from propagation_report import report

import nrl_shim  # noqa: F401  (explicit import in the parent only; NRL_SHIM was not set)

if __name__ == "__main__":
    with mp.get_context(sys.argv[1]).Pool(1) as pool:
        print(json.dumps(pool.apply_async(report).get(timeout=120)))
