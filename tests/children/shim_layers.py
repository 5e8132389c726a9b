"""Shared by the activation children: count the shim's enabled layers for a quirk on an attribute.

Imports nothing at module level, so importing it changes no import order a child checks.
"""


def layers(obj, quirk_id="ray-propagate-env"):
    """How many enabled layers of quirk_id wrap obj, walking the whole wrapper chain."""
    from nrl_shim import patching

    return sum(layer.quirk_id == quirk_id and layer.enabled for layer in patching.layers(obj))
