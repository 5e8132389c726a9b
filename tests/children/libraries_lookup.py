"""With argv[1] (a JSON list of site directories) put first on sys.path: how nrl_shim finds `demo_pkg` (quick and
thorough lookups, their description) and the version gate for the range argv[2], as JSON."""

import json
import sys

sys.path[:0] = json.loads(sys.argv[1])
# isort: off
from nrl_shim.libraries import find  # noqa: E402
from nrl_shim.registry import _check  # noqa: E402
import demo_pkg  # noqa: E402

# isort: on

quick, thorough = find("demo_pkg"), find("demo_pkg", thorough=True)
print(
    json.dumps(
        {
            "who": demo_pkg.WHO,
            "quick": quick._asdict(),
            "thorough": thorough._asdict(),
            "text": thorough.describe(),
            "gate": list(_check("demo_pkg", sys.argv[2])),
        }
    )
)
