"""The parent imports nrl_shim; a plain Python subprocess reports on itself."""

import subprocess
import sys
from pathlib import Path

import nrl_shim  # noqa: F401

child = str(Path(__file__).with_name("propagation_report.py"))
print(subprocess.run([sys.executable, child], capture_output=True, text=True, check=True).stdout.strip())
