"""Quirks through the patcher contract, in a fresh interpreter: `python -m nrl_shim.testing.contract_child ORDER
QUIRK_ID...` (run by nrl_shim.testing.QuirkContract; a plugin quirk is found through its entry point or
NRL_SHIM_PLUGINS). One interpreter checks every listed quirk: importing vLLM and torch once is most of a check's cost.

ORDER "before": all targets imported before activation; then per quirk, alone: activate twice, deactivate, and the
same with another tool's wrapper already on each attribute. ORDER "after": the listed quirks activated together, their
targets imported after. ORDER "setup" (one quirk): what setup() installs is there once, and deactivate() removes it.
Prints one JSON line, {quirk_id: result}; a quirk whose check raised gets {"error": traceback}. Which attributes a quirk
wraps is found, not declared: every attribute of the target modules (and of the classes they define) that carries a
layer of this quirk after activation.
"""

import importlib
import importlib.util
import inspect
import json
import pickle
import sys
import traceback

import wrapt

from nrl_shim import activation, registry
from nrl_shim.patching import _our_layer


def importable(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def owners(modules):
    """(owner, attribute name, object) for every attribute of the modules and of the classes they define."""
    for module in modules:
        for name, value in list(vars(module).items()):
            yield module, name, value
            if isinstance(value, type) and value.__module__ == module.__name__:
                for attr, member in list(vars(value).items()):
                    yield value, attr, member


def wrapped_by(quirk_id, modules):
    return {(id(owner), name): (owner, name, obj) for owner, name, obj in owners(modules) if _ours(obj, quirk_id)}


def _ours(obj, quirk_id):
    try:
        return _our_layer(obj, quirk_id) is not None
    except Exception:  # a module attribute whose __getattr__ raises (vLLM 0.8's UnspecifiedPlatform): not ours
        return False


def below_the_shim(obj):
    """What the shim's layers on obj wrap: under the fix's own layer there may be an engine's shared hook (one layer
    every fix following weight updates subscribes to: nrl_shim/quirks/sglang/_weight_updates.py), a layer of the shim
    too."""
    from nrl_shim import patching

    while isinstance(getattr(obj, "_self_wrapper", None), patching._Layer):
        obj = obj.__wrapped__
    return obj


def layers(obj, quirk_id):
    """How many layers of quirk_id a call of obj goes through (enabled or not)."""
    from nrl_shim import patching

    return sum(layer.quirk_id == quirk_id for layer in patching.layers(obj))


def pickles(obj):
    try:
        return pickle.loads(pickle.dumps(obj)) is not None
    except Exception as exc:  # reported, not raised: the test names the attribute
        return f"{type(exc).__name__}: {exc}"


def settings_for(quirk_ids):
    return registry.load_settings({"NRL_SHIM_DISABLE": ",".join(q for q in registry.quirk_ids() if q not in quirk_ids)})


def targets_of(quirk_id):
    """The targets this release has that the fix patches: its own (TARGETS) where it applies; where its release has
    the bug outside its reach, the hooks that name the case when it happens (CASE_TARGETS)."""
    quirk = registry.get(quirk_id)
    applies = quirk.gate()[0]
    return [t for t in quirk.targets if importable(t) and (quirk.patches(t) if applies else t in quirk._case_handlers)]


def check_setup(quirk_id):
    import os

    quirk = registry.get(quirk_id)
    settings = settings_for([quirk_id])

    def state():
        environ = {k: v for k, v in os.environ.items() if k != "NRL_SHIM"}  # activation's own, not setup()'s
        return [repr(f) for f in sys.meta_path], [repr(h) for h in sys.path_hooks], environ

    out: dict = {"targets": targets_of(quirk_id)}
    before = state()
    activation.activate(settings)
    first = state()
    activation.activate(settings)
    assert quirk.setup is not None
    quirk.setup(settings)  # setup() itself run twice: nothing added the second time
    out["once"] = state() == first
    activation.deactivate()
    out["restored"] = state() == before
    return out


def check_after(quirk_ids):
    """The quirks activated together (as in a job), then their targets imported: each patched on import, once."""
    activation.activate(settings_for(quirk_ids))
    targets = {q: targets_of(q) for q in quirk_ids}
    results = {}
    for quirk_id in quirk_ids:
        try:
            modules = [importlib.import_module(t) for t in targets[quirk_id]]
            results[quirk_id] = {
                "targets": targets[quirk_id],
                "patched": sorted(name for qid, name in activation.patched() if qid == quirk_id),
                "layers": {
                    f"{owner.__name__}.{name}": layers(getattr(owner, name), quirk_id)
                    for owner, name, _ in wrapped_by(quirk_id, modules).values()
                },
            }
        except Exception:
            results[quirk_id] = {"error": traceback.format_exc()}
    activation.deactivate()
    return results


def check_before(quirk_id, modules):
    """One quirk alone, its targets already imported: activate twice, deactivate, then over another tool's wrapper."""
    settings = settings_for([quirk_id])
    out: dict = {"targets": [m.__name__ for m in modules]}
    originals = {(id(o), n): (o, n, v) for o, n, v in owners(modules)}
    activation.activate(settings)
    activation.activate(settings)  # twice: still one layer each
    found = wrapped_by(quirk_id, modules)
    out["patched"] = sorted(name for qid, name in activation.patched() if qid == quirk_id)
    out["wrapped"] = {}
    for key, (owner, name, _obj) in found.items():
        label = f"{owner.__name__}.{name}"
        # Not among the owner's own attributes: a method the class inherits, wrapped on the subclass only.
        original = originals[key][2] if key in originals else getattr(owner.__mro__[1], name)
        entry = {"layers": layers(getattr(owner, name), quirk_id)}
        if callable(inspect.unwrap(original)) and not isinstance(original, (classmethod, staticmethod)):
            try:
                entry["signature_kept"] = inspect.signature(getattr(owner, name)) == inspect.signature(original)
            except (TypeError, ValueError):
                entry["signature_kept"] = "no signature"
            entry["pickles"] = pickles(getattr(owner, name))
        out["wrapped"][label] = entry
    activation.deactivate()
    out["restored"] = {  # an inherited method is inherited again (no attribute of ours left on the subclass)
        f"{o.__name__}.{n}": vars(o).get(n) is (originals[k][2] if k in originals else None)
        for k, (o, n, _) in found.items()
    }

    # Another tool wrapped the same attributes first: ours goes over theirs, and leaving keeps theirs.
    def other_tool(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    theirs = {}
    for key, (owner, name, _) in found.items():
        wrapt.wrap_function_wrapper(owner, name, other_tool)
        theirs[key] = vars(owner)[name]
    activation.activate(settings)
    out["over_other_tool"] = {
        f"{o.__name__}.{n}": layers(vars(o)[n], quirk_id) == 1 and below_the_shim(vars(o)[n]) is theirs[k]
        for k, (o, n, _) in found.items()
    }
    activation.deactivate()
    out["other_tool_kept"] = {f"{o.__name__}.{n}": vars(o)[n] is theirs[k] for k, (o, n, _) in found.items()}
    return out


def main() -> None:
    order, quirk_ids = sys.argv[1], sys.argv[2:]
    results: dict = {}
    if order == "setup":
        (quirk_id,) = quirk_ids
        results[quirk_id] = check_setup(quirk_id)
    elif order == "after":
        results = check_after(quirk_ids)
    else:
        # Every quirk's targets first (importing them is what the checks share), then each quirk alone over them.
        imported = {}
        for quirk_id in quirk_ids:
            try:
                imported[quirk_id] = [importlib.import_module(t) for t in targets_of(quirk_id)]
            except Exception:
                results[quirk_id] = {"error": traceback.format_exc()}
        for quirk_id, modules in imported.items():
            try:
                results[quirk_id] = check_before(quirk_id, modules)
            except Exception:
                results[quirk_id] = {"error": traceback.format_exc()}
                activation.deactivate()  # the next quirk starts from nothing active
    print(json.dumps(results))


if __name__ == "__main__":
    main()
