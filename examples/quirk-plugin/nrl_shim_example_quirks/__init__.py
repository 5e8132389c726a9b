"""Quirks for nrl-shim from outside its catalogue (an example plugin package). Nothing here is imported at start-up
but the quirk modules the entry points name, and those import only the stdlib at top level."""
