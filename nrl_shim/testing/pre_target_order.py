"""A quirk's PRE_TARGETS hooks through activation, for QuirkContract: `python -m nrl_shim.testing.pre_target_order ID`.
Each hook is observed (not replaced): whether it ran before its module's code (no names of the module's own yet) and whether what it returned ran
once the module had executed. Prints one JSON object."""

import importlib
import importlib.util
import json
import sys
from typing import Any

from nrl_shim import activation, registry


def observed(seen: dict[str, dict], name: str, before: Any) -> Any:
    def hook(module, settings):
        own = [k for k in vars(module) if not k.startswith("__")]
        seen[name] = {"names_before": len(own), "undone_after_exec": None}
        after = before(module, settings)
        if after is None:
            return None

        def undo():
            seen[name]["undone_after_exec"] = len([k for k in vars(module) if not k.startswith("__")]) > 0
            after()

        return undo

    return hook


def main() -> None:
    quirk_id = sys.argv[1]
    quirk = registry.get(quirk_id)
    others = [q for q in registry.quirk_ids() if q != quirk_id]
    hooks = quirk.module.PRE_TARGETS
    seen: dict[str, dict] = {}
    for name, before in list(hooks.items()):
        hooks[name] = observed(seen, name, before)
    activation.activate(registry.load_settings({"NRL_SHIM_DISABLE": ",".join(others)}))
    errors = {}
    for name in hooks:
        try:
            if importlib.util.find_spec(name.rpartition(".")[0]) is None:
                continue
            importlib.import_module(name)
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
    print(json.dumps({"seen": seen, "errors": errors, "patched": activation.patched()}))


if __name__ == "__main__":
    main()
