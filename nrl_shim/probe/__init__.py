"""The refit probe: checks, in each engine process, at each refit, that the weights the engine serves are the ones the
trainer sent, and names what is wrong before the rollouts are used (docs/probe.md).

Below both engines' fixes (nothing here imports activation or a quirk): an engine's probe module (a quirk module in
nrl_shim/quirks/<engine>/) subscribes to that engine's one "weights changed" hook and hands each refit to a
WeightsProbe (weights.py); the job report compares the replicas' records (replicas.py). What it checks today:

- weights vs the refit (each engine process, each model): an exact digest of every parameter's bits per weight version.
  Weights that changed with no refit since the last one (written under the engine), a refit that left them exactly as
  an earlier version (a checkpoint reloaded over the synced weights: TRL#5312's shape), and a refit whose sent tensors
  changed since they were last sent that changed no weight (it landed nowhere) are each one WARNING.
- served vs recomputed (vLLM V1's prefix cache; served.py): a prefix-cache hit after a refit on an entry cached
  before it is KV of older weights served to a request, named with its tokens.
- replica vs replica (the job report, across processes and nodes): replicas of one layout whose digests differ after
  the same number of refits, or a replica with fewer refits than the others, named by host, pid and rank.

Exact integers, not float tolerances: a digest is a sum of the weights' bit patterns (wrapping int64 arithmetic is
associative), so the same bits give the same digest on any device and in any order, and there is no noise to calibrate
and no threshold to cry wolf at.
"""
