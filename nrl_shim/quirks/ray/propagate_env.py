"""Every Ray worker of the job runs the shim, whatever its interpreter.

Ray workers do not run the driver's Python: NeMo RL starts its vLLM and policy workers with their own venvs
(runtime_env py_executable / uv / pip / conda), where nrl-shim is usually not installed, and a cluster started
separately (`ray start`) does not inherit the driver's environment. So ray.init() gets, merged into the user's
job-level runtime_env, using Ray's own mechanisms (each keeps what the user set):
  - env_vars: NRL_SHIM=1 and the NRL_* settings (keys the user set win);
  - py_modules: a copy of this package (wrapt and packaging under nrl_shim/_vendor, used only where the worker has
    none of its own), uploaded once per job and put on every worker's PYTHONPATH by Ray on any node;
  - worker_process_setup_hook: nrl_shim.ray_worker.setup, which activates the shim before any task or actor code
    runs and exports a bootstrap sitecustomize to the worker's children (vLLM engine-core processes ...); a hook the
    user set already runs right after ours.
Why py_modules + the hook rather than a PYTHONPATH env var alone: the path of the package on a worker node is only
known once Ray unpacked it there, and the hook runs in exactly the workers of this job.
Ray merges an actor's or task's runtime_env over the job's field by field, so an actor that sets its own py_modules
would drop ours: the options parser gets our uploaded package appended to such a list.
NRL_SHIM_RAY_SHIP=0 keeps only the env_vars part.
"""

import sys

from nrl_shim.settings import Variable, parse_bool

ID = "ray-propagate-env"
SUMMARY = (
    "ray.init(): every worker of the job runs the shim, whatever its interpreter (NRL_* env_vars, the shim "
    "shipped with py_modules, activated by worker_process_setup_hook)"
)
LINK = "https://docs.ray.io/en/latest/ray-core/handling-dependencies.html#runtime-environments"
LIBRARY = "ray"
VERSIONS = ">=2.0"
SETTINGS = (
    Variable(
        "NRL_SHIM_RAY_SHIP",
        "ray_ship",
        parse_bool,
        True,
        "`1` / `0`",
        'ship the shim to every Ray worker of the job (`py_modules` + worker setup hook; see "Ray"); `0`: '
        "`env_vars` only",
    ),
)


# NRL_SHIM_RECIPE is exported by the eager-recipes quirk at activation, so it is covered by the prefix too.
def patch_worker(module, settings):
    from nrl_shim.patching import rebind, wrap
    from nrl_shim.quirks.ray._ship import init_wrapper as shipping_init_wrapper

    def init_wrapper(wrapped, instance, args, kwargs):
        return shipping_init_wrapper(wrapped, instance, args, kwargs, settings)

    original = module.init
    wrap(module, "init", init_wrapper, ID)
    # `ray` binds `init` from this module; after the fact (ray imported before activation) rebind it too.
    rebind([sys.modules.get("ray")], "init", original, module.init)


def unpatch_worker(module):
    from nrl_shim.patching import rebind, unwrap

    wrapped = module.init
    unwrap(module, "init", ID)
    if module.init is not wrapped:
        rebind([sys.modules.get("ray")], "init", wrapped, module.init)


def patch_submission(module, settings):
    from nrl_shim.patching import wrap
    from nrl_shim.quirks.ray._ship import task_runtime_env_wrapper

    # ray.actor and ray.remote_function bind Ray's helper by name: wrap it where it is used.
    wrap(module, "get_runtime_env_info", task_runtime_env_wrapper, ID)


def unpatch_submission(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "get_runtime_env_info", ID)


TARGETS = {
    "ray._private.worker": (patch_worker, unpatch_worker),
    "ray.actor": (patch_submission, unpatch_submission),
    "ray.remote_function": (patch_submission, unpatch_submission),
}


def describe(settings, version):
    if not settings.ray_ship:
        return "NRL_SHIM_RAY_SHIP=0: NRL_* env_vars only; workers activate only where nrl-shim is installed"
    return "NRL_SHIM_RAY_SHIP=1: env_vars + the shim shipped (py_modules) and activated by worker_process_setup_hook"
