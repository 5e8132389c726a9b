"""Run with -S and NRL_SHIM=1: argv[1] (the checkout) and site-packages off sys.path, then argv[2], a site directory
holding only nrl_shim.pth (the package uninstalled), added as a site dir: Python starts, without the shim."""

import site
import sys

source_root, site_dir = sys.argv[1], sys.argv[2]
sys.path[:] = [p for p in sys.path if p != source_root and "site-packages" not in p]
site.addsitedir(site_dir)
print("started", "nrl_shim" in sys.modules)
