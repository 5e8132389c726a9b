"""SGLang data-parallel ranks sample distinct tokens: each DP rank's scheduler seeds its random generators apart.

With `--dp-size N` one SGLang server runs N scheduler processes (DataParallelController), and every one of them seeds
torch/numpy/random with the server's one `random_seed` (`set_random_seed(random_seed)` in the scheduler and its TP
worker; SGLang's default seed is random per server, but shared by its ranks). The ranks then draw the same random
numbers in the same order: requests spread over them round-robin come out identical in pairs. Measured on 0.5.23
(2 cores, `--dp-size 2`): a GRPO group of 8 requests of one prompt at temperature 1.0 gave 4 distinct completions
(concurrent or one at a time), 8 with one rank. An RL group then holds duplicates, which shrink its advantage estimates'
spread, no error.

The fix: in each scheduler process of DP rank r > 0 (the rank SGLang hands `run_scheduler_process`, or
`SGLANG_DP_RANK` where it reads that), the seed its scheduler and TP worker hand `set_random_seed` becomes seed + r (the
TP group's broadcast seed included, so a rank's TP workers stay alike); rank 0, and servers without DP, keep the seed
as it is. The server arguments are left alone (read-only once resolved from 0.5.2x). An explicit `--random-seed` is
kept as the base: runs stay reproducible. Requests with their own `sampling_seed` are untouched (SGLang seeds those per
request).
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED

ID = "sglang-dp-seed"
SUMMARY = "SGLang data-parallel ranks sample distinct tokens: DP rank r's scheduler seeds with random_seed + r"
LINK = "https://github.com/volcengine/verl/pull/5181"
LIBRARY = "sglang"
# run_scheduler_process(server_args, ..., dp_rank, ...) read in the wheels 0.5.10.post1 -> 0.5.23 (its other parameters
# change; the two used here are looked up by name); run on real servers with --dp-size 2: 0.5.10.post1, 0.5.12.post1
# and 0.5.23.
# The bug exists wherever DP ranks share the server's seed (every release read); declared with sglang's other fixes.
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_SCHEDULER, _TP_WORKER = "sglang.srt.managers.scheduler", "sglang.srt.managers.tp_worker"
REQUIRES = (
    f"{_SCHEDULER}:run_scheduler_process(server_args)",
    f"{_SCHEDULER}:set_random_seed",
    f"{_TP_WORKER}:set_random_seed",
)
WHAT = "SGLang DP rank's random seed"
_DP_RANK = [0]  # this process's DP rank, as run_scheduler_process was started for (0: none, or rank 0)


def _patch_scheduler(module, settings):
    from nrl_shim.patching import wrap

    wrap(module, "run_scheduler_process", _run_scheduler_process_wrapper, ID)
    wrap(module, "set_random_seed", _set_random_seed_wrapper, ID)


def _unpatch_scheduler(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "run_scheduler_process", ID)
    unwrap(module, "set_random_seed", ID)


def _patch_tp_worker(module, settings):
    from nrl_shim.patching import wrap

    wrap(module, "set_random_seed", _set_random_seed_wrapper, ID)


def _unpatch_tp_worker(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "set_random_seed", ID)


TARGETS = {_SCHEDULER: (_patch_scheduler, _unpatch_scheduler), _TP_WORKER: (_patch_tp_worker, _unpatch_tp_worker)}


def describe(settings, version):
    return (
        "with --dp-size > 1: DP rank r's scheduler seeds with random_seed + r (rank 0 and single-rank servers as set)"
    )


def dp_rank_of(bound_arguments):
    """The DP rank a scheduler process was started for: its `dp_rank` argument, else SGLANG_DP_RANK (0.5.23 reads it
    there when the launcher passes None); None without DP."""
    import os

    rank = bound_arguments.get("dp_rank")
    if rank is None and os.environ.get("SGLANG_DP_RANK", "").strip().isdigit():
        rank = int(os.environ["SGLANG_DP_RANK"])
    return rank


def _run_scheduler_process_wrapper(wrapped, instance, args, kwargs):
    import inspect

    try:
        _DP_RANK[0] = dp_rank_of(inspect.signature(wrapped).bind_partial(*args, **kwargs).arguments) or 0
    except TypeError:  # arguments this release's signature doesn't take: SGLang's own error follows
        pass
    return wrapped(*args, **kwargs)


def _set_random_seed_wrapper(wrapped, instance, args, kwargs):
    rank = _DP_RANK[0]
    if not rank or not args or not isinstance(args[0], int) or isinstance(args[0], bool):
        return wrapped(*args, **kwargs)
    from nrl_shim import report

    seed = args[0]
    report.changed(
        ID,
        f"{WHAT} (DP rank {rank})",
        seed,
        seed + rank,
        "DP ranks seeded alike sample the same tokens for requests spread over them (a GRPO group of 8 came out as 4 "
        f"distinct pairs); rank 0 keeps the server's seed; see {LINK}",
    )
    return wrapped(seed + rank, *args[1:], **kwargs)
