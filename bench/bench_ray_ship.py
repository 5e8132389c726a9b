"""What shipping the shim to Ray workers costs, measured in one run and printed as ratios (a script, not a test).

A driver (fresh interpreter, local `ray.init`) starts N actors one after the other, each in a fresh worker whose
runtime_env sets its own py_executable (as NeMo RL's workers do), and times ray.init and each actor's first call:
  shipped:  NRL_SHIM=1 (py_modules upload once per job + the worker setup hook in every worker)
  baseline: NRL_SHIM=1 NRL_SHIM_RAY_SHIP=0 (env_vars only; the shim never reaches those workers)
Goals: <= +0.5 s per actor; the upload once per job (ray.init).
Drivers alternate (baseline, shipped, baseline, ...) so drift hits both; medians are reported.
Usage: python bench/bench_ray_ship.py [--actors N] [--rounds R] [--worker-python PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

DRIVER = r"""
import json, sys, time
t0 = time.perf_counter()
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
t_init = time.perf_counter() - t0

@ray.remote(num_cpus=0.1)
class Probe:
    def ready(self):
        m = sys.modules.get("nrl_shim")
        return bool(m and m.is_active())

starts, active = [], []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    actor = Probe.options(runtime_env={"py_executable": sys.argv[2]}).remote()
    active.append(ray.get(actor.ready.remote()))
    starts.append(time.perf_counter() - t)
    ray.kill(actor)
ray.shutdown()
print(json.dumps({"init": t_init, "starts": starts, "active": active}))
"""


def run(env_extra, actors, worker_python):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_") and k != "PYTHONPATH"}
    env.update({"NRL_SHIM": "1", "RAY_AUTH_MODE": "disabled", **env_extra})
    with tempfile.TemporaryDirectory() as cwd:  # outside any checkout: workers see only what Ray ships
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, str(actors), worker_python],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=900,
        )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--worker-python",
        default=os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON", sys.executable),
        help="py_executable of the actors (default: NRL_SHIM_TEST_WORKER_PYTHON, else this Python)",
    )
    args = parser.parse_args()
    sides = {"baseline": {"NRL_SHIM_RAY_SHIP": "0"}, "shipped": {}}
    results = {name: {"init": [], "starts": [], "active": []} for name in sides}
    for i in range(args.rounds):
        for name, extra in sides.items():
            print(f"round {i + 1}/{args.rounds}: {name} driver, {args.actors} actors ...", file=sys.stderr, flush=True)
            out = run(extra, args.actors, args.worker_python)
            results[name]["init"].append(out["init"])
            results[name]["starts"].extend(out["starts"])
            results[name]["active"].extend(out["active"])
    base, ship = results["baseline"], results["shipped"]
    init_b, init_s = statistics.median(base["init"]), statistics.median(ship["init"])
    start_b, start_s = statistics.median(base["starts"]), statistics.median(ship["starts"])
    print(f"worker python: {args.worker_python}")
    print(
        f"shim active in actors: baseline {sum(base['active'])}/{len(base['active'])}, "
        f"shipped {sum(ship['active'])}/{len(ship['active'])}"
    )
    print(f"ray.init (upload once per job): baseline {init_b:.3f} s, shipped {init_s:.3f} s, +{init_s - init_b:.3f} s")
    print(
        f"actor start to first call (median of {len(ship['starts'])}): baseline {start_b:.3f} s, "
        f"shipped {start_s:.3f} s, +{start_s - start_b:.3f} s per actor (goal <= +0.5 s), "
        f"ratio {start_s / start_b:.3f}"
    )


if __name__ == "__main__":
    main()
