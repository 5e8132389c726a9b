"""A program that imports nothing: prints whether interpreter start-up (the shim's .pth included) imported logging."""

import sys

print("logging" in sys.modules)
