"""What nrl_shim finds for a package no distribution provides, as JSON."""

import json

from nrl_shim.libraries import find

print(json.dumps(find("no_such_pkg_xyz")._asdict()))
