"""PLACEHOLDER - being implemented (see the issue). Declares the interface only."""

ID = "vllm-gemma-load-format"
SUMMARY = "placeholder"
LINK = ""
LIBRARY = "vllm"
VERSIONS = ">=0"
TARGETS = ()


def patch(module):
    raise NotImplementedError


def unpatch(module):
    pass
