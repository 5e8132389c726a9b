pytest_plugins = ["nrl_shim.testing"]  # nrl-shim's quirk contract, run over this package's quirks
