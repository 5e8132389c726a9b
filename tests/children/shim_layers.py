"""Shared by the activation children: count the shim's enabled layers for a quirk on an attribute.

Imports nothing at module level, so importing it changes no import order a child checks.
"""


def layers(obj, quirk_id="ray-propagate-env"):
    """How many enabled layers of quirk_id wrap obj, walking the whole wrapper chain."""
    from nrl_shim.patching import _Layer

    n = 0
    while obj is not None:
        layer = getattr(obj, "_self_wrapper", None)
        if isinstance(layer, _Layer) and layer.quirk_id == quirk_id and layer.enabled:
            n += 1
        obj = getattr(obj, "__wrapped__", None)
    return n
