"""One module per quirk; see nrl_shim/registry.py for the interface each module declares."""
