"""cp-gemma3's gate on a second library (torch): as declared, outside its range, and not installed."""

import json
from importlib.metadata import version

from nrl_shim import registry

quirk = registry.get("cp-gemma3")  # transformers fix that acts through torch's context_parallel
declared = quirk.also_requires
applies = quirk.gate()[0]
quirk.also_requires = {"torch": "<1"}  # a range the installed torch is outside of
outside = quirk.gate()
quirk.also_requires = {"no-such-dist-xyz": ">=0"}
absent = quirk.gate()
print(json.dumps([declared, applies, outside, absent, version("transformers"), version("torch")]))
