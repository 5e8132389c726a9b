"""SGLang's deterministic inference samples each request apart: a request without `sampling_seed` gets its own seed.

With `--enable-deterministic-inference` (and `--rl-on-policy-target`, which turns it on) SGLang samples with a seeded
hash of (seed, position, token) instead of torch's generator, so a request's tokens no longer depend on its batch. A
request that brings no `sampling_seed` gets seed 42 (`SamplingBatchInfo.from_schedule_batch`, read in every wheel
0.5.10.post1 -> 0.5.23): every such request of one prompt draws the same noise at every position, and a GRPO group's
n samples (n requests, or one request with `n`: SGLang expands it into n requests) come out identical, no error. The
group's advantages are then all zero and it trains nothing (verl PR #6857, UniRL PR #208, AReaL #1523 found it).

The fix: in each scheduler process, a request without `sampling_seed` gets one derived from its request id (stable
for a caller that sets `rid`; distinct between requests, the n of one request included; alike on every TP rank of a
request, which all see its id), only where deterministic inference is on (where it is off SGLang never reads the
field). A request's own seed is kept, as SGLang keeps it: same seed, same tokens. Not covered: one request with
`n > 1` and its own `sampling_seed` gives n copies of one sample in SGLang (its n requests share the seed); give each
sample its own seed.

Measured on SGLang's own classes (tests/test_sglang_deterministic_seed.py): deterministic inference needs GPU kernels
(triton's seeded hash, batch-invariant matmuls) and does not start on a CPU, so the seeds SGLang's batch builder hands
its sampler are what is shown: eight requests of a group, 42 each without the shim, eight distinct with it.
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED

ID = "sglang-deterministic-seed"
SUMMARY = (
    "SGLang's deterministic inference samples each request apart: a request without sampling_seed gets its own "
    "(SGLang gives every such request 42, so a GRPO group's samples are identical)"
)
LINK = "https://github.com/verl-project/verl/pull/6857"
LIBRARY = "sglang"
# The default seed 42 and the two ways the scheduler knows deterministic inference is on (get_global_server_args() up
# to 0.5.12.post1, get_exec().deterministic from the 0.5.2x line), read in the wheels 0.5.10.post1, 0.5.12.post1 and
# 0.5.23; Req(rid, ..., sampling_params) in each. Declared with sglang's other fixes.
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_BATCH = "sglang.srt.managers.schedule_batch"
_SAMPLING_INFO = "sglang.srt.sampling.sampling_batch_info"
REQUIRES = (
    f"{_BATCH}:Req.__init__(rid, sampling_params)",
    f"{_SAMPLING_INFO}:SamplingBatchInfo.from_schedule_batch",
)
WHAT = "SGLang request's sampling seed under deterministic inference"


def patch_batch(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.Req, "__init__", _req_init_wrapper, ID)


def unpatch_batch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Req, "__init__", ID)


# Where SGLang's batch builder reads whether deterministic inference is on: the fix reads it there too (nothing wrapped).
_SETTINGS: dict = {}


def read_settings_from(module, settings):
    _SETTINGS["module"] = module
    if not hasattr(module, "get_exec") and not hasattr(module, "get_global_server_args"):  # a release not read
        from nrl_shim import report

        report.warn_once(
            ID,
            "settings",
            f"[{ID}] {WHAT}: {module.__name__} has neither get_exec nor get_global_server_args (where SGLang says "
            "whether deterministic inference is on): requests keep SGLang's seeds",
        )


def forget_settings(module):
    _SETTINGS.clear()


TARGETS = {_BATCH: (patch_batch, unpatch_batch), _SAMPLING_INFO: (read_settings_from, forget_settings)}


def describe(settings, version):
    return (
        "with deterministic inference on: a request without sampling_seed gets one derived from its request id "
        "(SGLang: 42 for all); a request's own seed kept"
    )


def deterministic_inference():
    """Whether this scheduler process runs SGLang's deterministic inference, read each request where SGLang's batch
    builder reads it (a settings lookup); None where SGLang's settings are not set (a Req built outside a scheduler)."""
    sampling_info = _SETTINGS.get("module")
    if sampling_info is None:  # SGLang's batch builder not imported: no scheduler here
        return None
    try:
        if hasattr(sampling_info, "get_exec"):  # the 0.5.2x line
            return bool(sampling_info.get_exec().deterministic.enable_deterministic_inference)
        return bool(sampling_info.get_global_server_args().enable_deterministic_inference)  # up to 0.5.12.post1
    except Exception:  # not set in this process
        return None


def seed_of(rid):
    """The seed of a request without one: 63 bits of a hash of its id (SGLang takes int64 seeds)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(str(rid).encode(), digest_size=8).digest(), "big") >> 1


def _req_init_wrapper(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    try:
        params = instance.sampling_params
        if getattr(params, "sampling_seed", 0) is not None or not deterministic_inference():
            return
        import copy

        params = copy.copy(params)  # the request's own: requests unpickled from one batch may share one object
        params.sampling_seed = seed_of(instance.rid)
        instance.sampling_params = params
    except Exception as error:  # never break a request over this
        from nrl_shim import report

        report.logger().debug("[%s] request seed not set: %r", ID, error)
        return
    from nrl_shim import report

    report.changed(
        ID,
        WHAT,
        "42 (SGLang's default for every request without sampling_seed)",
        "one derived from the request id (each request its own)",
        "requests of one prompt with SGLang's one default seed sample the same tokens: a GRPO group's samples come "
        f"out identical; a request's own sampling_seed is kept (n > 1 with one seed still gives n copies); see {LINK}",
    )
