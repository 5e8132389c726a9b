"""CUDA graphs off (enforce_eager=True) for recipes known to converge badly with them.

The recipe is NRL_SHIM_RECIPE, or is detected at activation from the driver's command line
(`--config path/to/<recipe>.yaml` or `--config=...`, Hydra-style overrides after it are fine) and then exported as
NRL_SHIM_RECIPE so subprocesses and Ray workers (see ray-propagate-env) see it too. The effect is applied in
EngineArgs.create_engine_config(), before vLLM derives its compilation / CUDA-graph settings from enforce_eager.

More patterns: NRL_SHIM_EAGER_RECIPES (comma list of globs), or an entry point in the group
"nrl_shim.eager_recipes" whose object is a glob, an iterable of globs, or a mapping {glob: reason}.
"""

import os
import sys

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.settings import Variable, parse_word, parse_words

ID = "vllm-eager-recipes"
SUMMARY = "recipes that converge badly with CUDA graphs (DeepScaleR 1.5B): vLLM enforce_eager=True"
LINK = "https://github.com/NVIDIA-NeMo/RL/pull/857"
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
    "vllm.engine.arg_utils:EngineArgs.enforce_eager",
)
EXPLAIN_FIELDS = ("model_config.enforce_eager",)  # engine-config fields this fix sets (for `nrl-shim explain`)
EXPLAIN_DERIVED = ("compilation_config.", "kernel_config.")  # what vLLM derives from enforce_eager (graph sizes...)
SETTINGS = (
    Variable(
        "NRL_SHIM_RECIPE",
        "recipe",
        parse_word,
        None,
        "recipe name, e.g. `grpo-deepscaler-1.5b-8K`",
        "recipe for the eager-mode fix; when unset it is detected from the driver's `--config "
        "path/to/<recipe>.yaml` and exported for children",
    ),
    Variable(
        "NRL_SHIM_EAGER_RECIPES",
        "eager_recipes",
        parse_words,
        (),
        "comma list of globs, e.g. `my-recipe-*`",
        "more recipes that need `enforce_eager=True` (packages can also add them via the entry-point group "
        "`nrl_shim.eager_recipes`: a glob, a list of globs, or `{glob: reason}`)",
    ),
)

ENTRY_POINT_GROUP = "nrl_shim.eager_recipes"
_DEEPSCALER = "convergence problems with vLLM CUDA graphs; NeMo RL sets enforce_eager: True (NeMo RL PR #857)"
EAGER_RECIPES = {
    "grpo-deepscaler-1.5b-8K": _DEEPSCALER,
    "grpo-deepscaler-1.5b-16K": _DEEPSCALER + "; inherits the 8K recipe",
    "grpo-deepscaler-1.5b-24K": _DEEPSCALER,
    "grpo-gspo-deepscaler-1.5b-8K": _DEEPSCALER,
}
_RECIPE_SUFFIXES = (".yaml", ".yml")


class _State:
    detected: "str | None" = None  # recipe name found on this process's command line
    exported = False  # we set NRL_SHIM_RECIPE (teardown removes it)
    plugin_patterns: "dict[str, str] | None" = None  # {glob: reason} from entry points, loaded on first engine config


def recipe_name(value):
    """`path/to/grpo-deepscaler-1.5b-8K.yaml` -> `grpo-deepscaler-1.5b-8K`."""
    name = os.path.basename(str(value).strip().rstrip("/\\"))
    for suffix in _RECIPE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def recipe_from_argv(argv):
    """The recipe of `--config X` / `--config=X` in argv (the last one wins, as with argparse), or None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--config="):
            found = arg[len("--config=") :]
    return recipe_name(found) if found else None


SETUP_ARGV = "--config"  # setup() detects the recipe from it: other processes don't import this module at start-up


def setup(settings):
    if settings.recipe is not None or "NRL_SHIM_RECIPE" in os.environ:
        return
    detected = recipe_from_argv(getattr(sys, "argv", None) or [])
    if not detected:
        return
    from nrl_shim.errors import SettingsError

    try:
        parse_word("NRL_SHIM_RECIPE", detected)  # children parse it: export only valid names
    except SettingsError:
        return
    _State.detected = detected
    os.environ["NRL_SHIM_RECIPE"] = detected
    _State.exported = True


def teardown():
    if _State.exported and os.environ.get("NRL_SHIM_RECIPE") == _State.detected:
        os.environ.pop("NRL_SHIM_RECIPE", None)
    _State.detected, _State.exported = None, False


def current_recipe(settings):
    if settings is None:
        return None
    return settings.recipe and recipe_name(settings.recipe) or _State.detected


def _plugin_patterns():
    if _State.plugin_patterns is None:
        patterns = {}
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                value = ep.load()
            except Exception as exc:  # a broken plugin must not break engine creation
                from nrl_shim import report

                report.record(
                    ID,
                    "warning",
                    "[%s] entry point %s could not be loaded: %s: %s",
                    ID,
                    ep.name,
                    type(exc).__name__,
                    exc,
                )
                continue
            if isinstance(value, str):
                value = {value: f"entry point {ep.name}"}
            elif not isinstance(value, dict):
                value = {str(glob): f"entry point {ep.name}" for glob in value}
            patterns.update({str(glob): str(reason) for glob, reason in value.items()})
        _State.plugin_patterns = patterns
    return _State.plugin_patterns


def eager_reason(recipe, settings):
    """Why `recipe` needs enforce_eager=True, or None when it does not."""
    if not recipe:
        return None
    table = dict(EAGER_RECIPES)
    table.update({glob: "listed in NRL_SHIM_EAGER_RECIPES" for glob in settings.eager_recipes})
    table.update(_plugin_patterns())
    import fnmatch  # here, not at the top: it pulls in `re` at every interpreter start-up

    lowered = recipe.lower()
    for glob, reason in table.items():
        if fnmatch.fnmatchcase(lowered, glob.lower()):
            return reason
    return None


def fix_engine_args(engine_args, settings):
    recipe = current_recipe(settings)
    reason = eager_reason(recipe, settings) if recipe else None
    if reason is None or getattr(engine_args, "enforce_eager", None):
        return
    before = engine_args.enforce_eager
    engine_args.enforce_eager = True
    from nrl_shim import report

    report.changed(ID, f"vllm enforce_eager for recipe {recipe}", before, True, f"{reason}; {LINK}")


def patch(module, settings):
    from nrl_shim.quirks.vllm._common import wrap_engine_config

    wrap_engine_config(module, ID, fix_engine_args, settings)


def unpatch(module):
    from nrl_shim.quirks.vllm._common import unwrap_engine_config

    unwrap_engine_config(module, ID)


TARGETS = {"vllm.engine.arg_utils": (patch, unpatch)}


def idle(settings, version):
    """Why the fix has nothing to do here (for `nrl-shim doctor`), or None."""
    recipe = current_recipe(settings)
    if not recipe:
        return "no recipe: NRL_SHIM_RECIPE is unset and this command has no --config <recipe>.yaml"
    if not eager_reason(recipe, settings):
        return f"recipe {recipe} is not listed as needing enforce_eager"
    return None


def describe(settings, version):
    recipe = current_recipe(settings)
    if not recipe:
        return "no recipe (set NRL_SHIM_RECIPE or run with --config <recipe>.yaml)"
    reason = eager_reason(recipe, settings)
    return f"recipe {recipe}: " + ("enforce_eager=True" if reason else "not listed; CUDA graphs left as configured")
