"""Refit guard: a model loaded with load_format="dummy" must not generate from tensors that no refit wrote.

RL frameworks start vLLM with dummy (random) weights and refit it from the trainer. A tensor the refit misses (a
name vLLM's load_weights skips or maps elsewhere, a layer left out of a bucketed transfer, a persistent buffer such
as Gemma's `normalizer` on vLLM < 0.9.2) keeps its random values and rollouts silently come from a half-random model.
vLLM's own check (recent releases' reload_weights warns "weights were not loaded") sees parameters only, judges each
call alone (a refit split over several calls warns once per bucket) and is not on the path of frameworks that call
the model's load_weights directly.

How, in the process that holds the model: around vLLM's dummy init, SAMPLES values at evenly spaced positions of every
floating tensor in the state_dict (what dummy init randomises) are recorded, before and after; the tensors that dummy
init changed and that vLLM's post-load processing left in place are guarded (re-derived ones, like attention scales
reset to 1.0, and repacked ones are not). The model's own `load_weights` (the call vLLM's in-place reload_weights, NeMo
RL and verl all make) is wrapped on the instance; after a call a one-shot forward pre-hook is armed, so the check runs
once at the next generation step, after every call of a bucketed refit. Values are compared, not calls: a write by any
route counts, buffers and tied weights included. A guarded tensor whose samples all still hold their dummy values was
written by no refit and is reported once; when nothing is left to guard, the guard removes itself.
"""

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.quirks.vllm.refit import _model_events as model_events

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any
    from weakref import WeakKeyDictionary, WeakSet

ID = "vllm-refit-guard"
SUMMARY = "Dummy-init models: at the first generation step after a refit, report tensors no refit wrote"
LINK = "https://github.com/vllm-project/vllm/pull/19788"
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.model_executor.model_loader.dummy_loader:DummyModelLoader.load_model",
    "vllm.model_executor.model_loader.dummy_loader:DummyModelLoader.load_weights",
)
# DummyModelLoader's module: loader.py up to 0.8.x, dummy_loader.py from 0.9 (one per release, patched alike).
LOADER_MODULES = ("vllm.model_executor.model_loader.loader", "vllm.model_executor.model_loader.dummy_loader")

SAMPLES = 8  # positions per tensor: a written tensor changes at all of them (dummy values are random floats)
_SHOWN = 8  # names listed in the warning; all of them at DEBUG
# Created on first use (start-up stays stdlib-light): models being dummy-loaded -> their samples before dummy init;
# guarded models, for unpatch.
_BEFORE_DUMMY: "WeakKeyDictionary[Any, dict] | None" = None
_GUARDS: "WeakSet[Any] | None" = None


def patch(module, settings):
    from nrl_shim.patching import wrap

    def loaded(model, loader, vllm_config, model_config=None):
        if isinstance(loader, module.DummyModelLoader):
            watch(model, _model_label(model, vllm_config), settings)

    def load_model_wrapper(wrapped, instance, args, kwargs):
        model = wrapped(*args, **kwargs)
        try:
            loaded(model, instance, kwargs.get("vllm_config", args[0] if args else None))
        except Exception as error:  # the guard must never break a load
            from nrl_shim import report

            report.logger().debug("[%s] not guarding this model: %r", ID, error)
        return model

    def dummy_init_wrapper(wrapped, instance, args, kwargs):
        # Samples before dummy init tell which tensors it randomised: vLLM re-derives some right after (attention
        # scales back to 1.0), and those no refit sends must not be reported.
        model = kwargs.get("model", args[0] if args else None)
        try:
            _before_dummy()[model] = _sample(model)
        except Exception as error:
            from nrl_shim import report

            report.logger().debug("[%s] not guarding this model: %r", ID, error)
        return wrapped(*args, **kwargs)

    if "load_model" in vars(module.DummyModelLoader) or not hasattr(module, "BaseModelLoader"):
        wrap(module.DummyModelLoader, "load_model", load_model_wrapper, ID)  # 0.8.x: each loader its own load_model
    else:  # 0.9+: BaseModelLoader.load_model, the one load step, is model_events' hook
        model_events.subscribe_load(module, ID, loaded=loaded)
    if hasattr(module, "initialize_dummy_weights") and "load_weights" not in vars(module.DummyModelLoader):
        wrap(module, "initialize_dummy_weights", dummy_init_wrapper, ID)  # 0.8.x: load_model calls it by this name
    else:
        wrap(module.DummyModelLoader, "load_weights", dummy_init_wrapper, ID)  # 0.9+: the dummy-init step


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.DummyModelLoader, "load_model", ID)
    if hasattr(module, "BaseModelLoader"):
        model_events.unsubscribe_load(module, ID)
    unwrap(module.DummyModelLoader, "load_weights", ID)
    unwrap(module, "initialize_dummy_weights", ID)
    for model in list(_GUARDS or ()):
        guard = getattr(model, "_nrl_shim_refit_guard", None)
        if guard is not None:
            guard.stop()


TARGETS = {name: (patch, unpatch) for name in LOADER_MODULES}


def describe(settings, version):
    return (
        "after a dummy-weight load: at the first generation step after a refit, dummy tensors no refit wrote are "
        + ("an error (strict)" if settings.strict else "a warning")
    )


def _model_label(model, vllm_config):
    path = getattr(getattr(vllm_config, "model_config", None), "model", None)
    return f"{type(model).__name__} ({path})" if path else type(model).__name__


def _before_dummy():
    global _BEFORE_DUMMY
    if _BEFORE_DUMMY is None:
        import weakref

        _BEFORE_DUMMY = weakref.WeakKeyDictionary()
    return _BEFORE_DUMMY


def watch(model, label, settings):
    """Guard `model`, just loaded with dummy weights: check it at the first generation step after each refit."""
    global _GUARDS
    import weakref

    before = _before_dummy().pop(model, None)
    if before is None:
        from nrl_shim import report

        report.logger().debug("[%s] %s: dummy init not seen; cannot tell which tensors it wrote", ID, label)
        return None
    if _GUARDS is None:
        _GUARDS = weakref.WeakSet()
    guard = _RefitGuard(model, label, settings, before)
    if guard.fingerprints:
        _GUARDS.add(model)
    return guard


def _sample(model):
    """{name: (shape, dtype, step, values)}: SAMPLES values of every floating tensor in the state_dict (the set dummy
    init randomises), evenly spaced over its elements."""
    import torch

    samples = {}
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if torch.is_floating_point(tensor) and tensor.numel() and tensor.device.type != "meta":
                numel = tensor.numel()
                step = max(1, (numel - 1) // (SAMPLES - 1)) if numel > 1 else 1
                samples[name] = (tensor.shape, tensor.dtype, step, _values(tensor, step).clone())
    return samples


def _unchanged_counts(now, before):
    """Per tensor, how many sampled values are equal in `now` and `before` (lists of 1-D tensors, pairwise the same
    length): one comparison and one device sync for the whole model (mixed float dtypes widen exactly)."""
    import torch

    with torch.no_grad():
        same = (torch.cat(now) == torch.cat(before)).tolist() if now else []
    counts, start = [], 0
    for values in before:
        counts.append(sum(same[start : start + values.numel()]))
        start += values.numel()
    return counts


def _values(tensor, step):
    """The sampled elements of `tensor` as a view (no kernel, no copy): cat() of all of them is one gather."""
    import torch

    count = min(tensor.numel(), SAMPLES)
    if tensor.is_contiguous():
        return tensor.as_strided((count,), (step,))
    return torch.take(tensor, torch.arange(count, device=tensor.device) * step)


class _RefitGuard:
    def __init__(self, model, label, settings, before):
        import weakref

        self.model_ref = weakref.ref(model)
        self.label, self.settings, self.hook = label, settings, None
        after = _sample(model)
        # Dummy-initialised: changed by the dummy load. Gone or reshaped since (a repack into another layout, e.g. the
        # CPU backend's linear weights): can't be compared later.
        kept = [n for n, (shape, dtype, _, v) in after.items() if n in before and before[n][:2] == (shape, dtype)]
        unchanged = _unchanged_counts([after[n][3] for n in kept], [before[n][3] for n in kept])
        self.fingerprints = {n: after[n] for n, count in zip(kept, unchanged) if count < after[n][3].numel()}
        self.total = len(self.fingerprints)
        # Where each tensor lives (module, attribute): read there at check time, a dict lookup instead of a state_dict
        # walk. A tensor vLLM replaces inside its module (a repack) is still found; a module replaced by a wrapper
        # (LoRA) keeps the original as its base layer, which is what a refit writes.
        self.owners = {}
        for name in self.fingerprints:
            module_name, _, attribute = name.rpartition(".")
            self.owners[name] = (model.get_submodule(module_name), attribute)
        # check()'s exact path once, here at load time: its one-time costs (first strided cat) don't land in the first
        # generation step after the refit.
        _unchanged_counts(
            [_values(self._tensor(name), sample[2]) for name, sample in self.fingerprints.items()],
            [sample[3] for sample in self.fingerprints.values()],
        )
        from nrl_shim import report

        log = report.logger()
        opaque = sorted(name for name in before if name not in after or before[name][0] != after[name][0])
        if opaque:
            log.debug("[%s] %s: cannot guard %s (replaced or reshaped after loading)", ID, label, ", ".join(opaque))
        if not self.fingerprints:
            return
        from nrl_shim.patching import wrap_instance

        def load_weights_wrapper(wrapped, instance, args, kwargs):
            try:
                return wrapped(*args, **kwargs)
            finally:  # also after a failed call: what it did write counts, and generation may still follow
                self.refit_seen()

        # On the instance: the class and other models stay untouched; other fixes' layers there are left as they are.
        wrap_instance(model, "load_weights", load_weights_wrapper, ID)
        model._nrl_shim_refit_guard = self
        log.debug("[%s] %s loaded with dummy weights: %d tensors guarded", ID, label, self.total)

    def refit_seen(self):
        model = self.model_ref()
        if self.hook is None and model is not None and self.fingerprints:
            self.hook = model.register_forward_pre_hook(self._before_generation)

    def _before_generation(self, module, args):
        hook, self.hook = self.hook, None
        if hook is not None:  # always set here: this runs as that hook
            hook.remove()
        from nrl_shim.errors import RefitIncompleteError

        try:
            self.check(module)
        except RefitIncompleteError:
            raise
        except Exception as error:  # a check that can't run must not stop generation
            from nrl_shim import report

            report.logger().debug("[%s] %s: check failed: %r", ID, self.label, error)

    def _tensor(self, name):
        module, attribute = self.owners[name]
        tensor = module._parameters.get(attribute)
        return module._buffers.get(attribute) if tensor is None else tensor

    def check(self, model):
        """Compare each fingerprint with the model's tensors now; report the unwritten ones (once each)."""
        import torch

        from nrl_shim import report

        log = report.logger()
        current = {}
        now, before, compared, unknown = [], [], [], []
        with torch.no_grad():
            for name, (shape, dtype, step, dummy) in self.fingerprints.items():
                current[name] = tensor = self._tensor(name)
                if tensor is None or tensor.shape != shape or tensor.dtype != dtype or tensor.device != dummy.device:
                    unknown.append(name)
                    continue
                compared.append(name)
                now.append(_values(tensor, step))
                before.append(dummy)
        counts = _unchanged_counts(now, before)
        unwritten, partly = [], []
        for name, count in zip(compared, counts):
            samples = self.fingerprints[name][3].numel()
            if count == samples:
                unwritten.append(name)
            elif count:
                partly.append(f"{name} ({count}/{samples} sampled values unchanged)")
            del self.fingerprints[name]  # written or reported: never looked at again
        for name in unknown:
            del self.fingerprints[name]
        if unknown:
            log.debug(
                "[%s] %s: cannot tell whether the refit wrote %s (gone or reshaped since loading)",
                ID,
                self.label,
                ", ".join(unknown),
            )
        if partly:
            log.debug("[%s] %s: partly unchanged after the refit (e.g. padding): %s", ID, self.label, ", ".join(partly))
        if not self.fingerprints:
            self.stop()
        if unwritten:
            self._report(unwritten, current)

    def _report(self, names, current):
        listed = [f"{name} {tuple(current[name].shape)}" for name in names]
        shown = ", ".join(listed[:_SHOWN]) + (f" and {len(listed) - _SHOWN} more" if len(listed) > _SHOWN else "")
        advice = "check that the refit sends these names and that vLLM's load_weights maps them to these tensors"
        if any(name.endswith("normalizer") for name in names):
            advice += (
                "; a Gemma `normalizer` is a buffer no refit sends on vLLM < 0.9.2: load Gemma with "
                "load_format='auto' (the shim's vllm-gemma-load-format fix, NRL_SHIM_GEMMA_LOAD_FORMAT=always)"
            )
        message = (
            f"[{ID}] {self.label} loaded with dummy weights is about to generate, but {len(names)} of its "
            f"{self.total} dummy-initialised tensors were written by no refit (they still hold random values): "
            f"{shown}. Rollouts would come from a partly random model; {advice}. See {LINK}"
        )
        from nrl_shim import report

        if len(listed) > _SHOWN:
            report.logger().debug("[%s] all unwritten tensors of %s: %s", ID, self.label, ", ".join(listed))
        if self.settings.strict:
            from nrl_shim.errors import RefitIncompleteError

            raise RefitIncompleteError(message + f" (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns the guard off)")
        report.record(ID, "warning", "%s", message)

    def stop(self):
        """Nothing left to guard (or deactivated): the model gets its own load_weights back, no hook stays."""
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        self.fingerprints = {}
        model = self.model_ref()
        if model is not None:
            from nrl_shim.patching import unwrap_instance

            unwrap_instance(model, "load_weights", ID)
            vars(model).pop("_nrl_shim_refit_guard", None)
