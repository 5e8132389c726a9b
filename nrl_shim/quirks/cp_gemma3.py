"""PLACEHOLDER - being implemented (see the issue). Declares the interface only."""

ID = "cp-gemma3"
SUMMARY = "placeholder"
LINK = ""
LIBRARY = "torch"
VERSIONS = ">=0"
TARGETS = ()


def patch(module):
    raise NotImplementedError


def unpatch(module):
    pass
