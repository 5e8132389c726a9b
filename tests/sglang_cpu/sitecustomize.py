"""Test harness for SGLang on a CPU machine (README.md beside this file): on PYTHONPATH in the processes of an SGLang
engine under test (its scheduler and detokenizer inherit the variable), so that PyPI's torchvision imports there
unchanged (torchvision_ops.py says how)."""

import torchvision_ops

torchvision_ops.install()
