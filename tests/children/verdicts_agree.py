"""Activation's verdicts against doctor's, for test_verdicts_agree.py: `python verdicts_agree.py [LIBRARY ...]`. The shim
active (NRL_SHIM=1), every target module of every fix of the LIBRARYs (all fixes without an argument) imported as a job
would (a module this release lacks, or one that fails to import here, left out), then per fix that activation gated:
its verdict at the last target import and doctor's entry for it, computed in this process after those imports. Prints
one JSON line: {"compared": {quirk id: [activation's state, doctor's state, activation's reason, doctor's reason]},
"imported": count, "not_imported": count}.
"""

import importlib
import json
import sys

import nrl_shim
from nrl_shim import activation, cli, registry

settings = nrl_shim.activate()
libraries = set(sys.argv[1:])
quirks = [q for q in registry.quirks() if not libraries or q.library in libraries]
imported = not_imported = 0
for quirk in quirks:
    for name in quirk.targets:
        try:
            importlib.import_module(name)
            imported += 1
        except Exception:  # noqa: BLE001  (not on this release, or not importable without a GPU: no job imports it)
            not_imported += 1
found = activation.verdicts()
compared = {}
for quirk in quirks:
    if quirk.id in found:
        entry = cli._quirk_entry(quirk, settings)
        compared[quirk.id] = [found[quirk.id].state, entry["status"], found[quirk.id].reason, entry["reason"]]
print(json.dumps({"compared": compared, "imported": imported, "not_imported": not_imported}))
