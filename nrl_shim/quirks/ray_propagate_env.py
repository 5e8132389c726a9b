"""Ray workers of a cluster started separately (`ray start`) do not inherit the driver's environment, so without
help they would run without the shim. ray.init(...) gets the shim's variables added to runtime_env["env_vars"];
Ray then sets them in every worker of the job, whose .pth activates the shim. Variables the user set there win.
(A local cluster started by ray.init() inherits the driver's environment anyway; the addition is then a no-op.)
"""

import os
import sys

ID = "ray-propagate-env"
SUMMARY = "ray.init(): add NRL_SHIM and the NRL_* settings to runtime_env env_vars so every Ray worker is covered"
LINK = "https://docs.ray.io/en/latest/ray-core/handling-dependencies.html#runtime-environments"
LIBRARY = "ray"
VERSIONS = ">=2.0"
TARGETS = ("ray._private.worker",)

# NRL_SHIM_RECIPE is exported by the eager-recipes quirk at activation, so it is covered by the prefix too.
_PREFIXES = ("NRL_SHIM", "NRL_VLLM_")


def shim_env_vars(environ=None):
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(_PREFIXES)}


def _init_wrapper(wrapped, instance, args, kwargs):
    from .. import report

    runtime_env = kwargs.get("runtime_env")
    before = dict(runtime_env) if runtime_env else {}
    env_vars = dict(before.get("env_vars") or {})
    added = {k: v for k, v in shim_env_vars().items() if k not in env_vars}
    if added:
        after = dict(before, env_vars={**env_vars, **added})
        if runtime_env is not None and not isinstance(runtime_env, dict):
            after = type(runtime_env)(**after)  # ray.runtime_env.RuntimeEnv is a dict subclass built from kwargs
        kwargs = dict(kwargs, runtime_env=after)
        report.changed(ID, "ray.init runtime_env['env_vars']", env_vars, {**env_vars, **added},
                       "so workers on a separately started Ray cluster activate the shim too")
    return wrapped(*args, **kwargs)


def patch(module):
    from ..patching import wrap

    original = module.init
    wrap(module, "init", _init_wrapper, ID)
    # `ray` binds `init` from this module; after the fact (ray imported before activation) rebind it too.
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "init", None) is original:
        ray.init = module.init


def unpatch(module):
    from ..patching import unwrap

    wrapped = module.init
    unwrap(module, "init", ID)
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "init", None) is wrapped and module.init is not wrapped:
        ray.init = module.init
