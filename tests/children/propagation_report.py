"""What a process reports about itself: NRL_SHIM, shim active, and the real Ray function patched once imported.

Imported by the propagation children (report() runs in their multiprocessing workers and Ray actors); run as a
program, it prints that report as JSON and exits with argv[1] (default 0).
"""


def report():
    import os
    import sys

    import ray._private.worker as w

    from nrl_shim.patching import is_wrapped

    shim = sys.modules.get("nrl_shim")
    return [os.environ.get("NRL_SHIM"), bool(shim and shim.is_active()), is_wrapped(w, "init", "ray-propagate-env")]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(report()))
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
