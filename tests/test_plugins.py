"""Quirks from other packages (entry-point group `nrl_shim.quirks`): found at the next start after an install or a
removal, without a scan of every distribution at every start; clashes are one clear error naming both distributions; a
plugin that fails to import is skipped with one warning (an error in strict mode); its settings are parsed like the
core's. The distributions here are written as installers write them (a `*.dist-info` with METADATA and
entry_points.txt beside the package) into a directory on PYTHONPATH; the example plugin is installed for real by
tests/test_plugin_example.py."""

import json
import os
import shutil

import pytest

from conftest import SOURCE_ROOT, run_child

QUIRK = """
from nrl_shim.settings import Variable, parse_seconds

ID = "{id}"
SUMMARY = "an acme fix"
LINK = "https://example.org/acme"
LIBRARY = "{library}"
VERSIONS = ">=0"
TARGETS = ("acme_target",)
SETTINGS = ({settings})
{extra}

def _wrapper(wrapped, instance, args, kwargs):
    return "patched by " + ID


def patch(module, settings):
    from nrl_shim.patching import wrap

    wrap(module, "run", _wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "run", ID)
"""
SETTING = 'Variable("NRL_ACME_WAIT", "acme_wait", parse_seconds, 5.0, "seconds", "how long acme waits"),'


def install(site, dist, package, quirks):
    """Write distribution `dist` into `site`: package `package` with one module per {id: (module, source)}, and its
    entry points."""
    (site / package).mkdir(parents=True, exist_ok=True)
    (site / package / "__init__.py").write_text("")
    lines = []
    for quirk_id, (module, source) in quirks.items():
        (site / package / f"{module}.py").write_text(source)
        lines.append(f"{quirk_id} = {package}.{module}")
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nrl_shim.quirks]\n" + "\n".join(lines) + "\n")
    return info


def quirk(quirk_id="acme-fix", library="packaging", settings="", extra=""):
    return QUIRK.format(id=quirk_id, library=library, settings=settings, extra=extra)


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "acme_target.py").write_text("def run():\n    return 'original'\n")
    return site


def probe(tmp_path, site, env=None, check=True, target=True):
    path = os.pathsep.join([SOURCE_ROOT, str(site)])
    extra = {"NRL_SHIM": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": path, **(env or {})}
    proc = run_child("plugin_probe", *(["--target", "acme_target"] if target else []), env=extra, check=check)
    return (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None), proc


def test_an_installed_plugin_applies_and_an_unchanged_environment_is_not_scanned_again(tmp_path, site):
    out, _ = probe(tmp_path, site)
    assert out["quirks"] == {} and out["run"] == "original"  # before the install
    info = install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk())})
    out, proc = probe(tmp_path, site)
    assert out["quirks"] == {"acme-fix": "acme-quirks"}, proc.stderr
    assert out["run"] == "patched by acme-fix" and out["scanned"]  # installed since the last start: scanned
    out, _ = probe(tmp_path, site)
    assert out["run"] == "patched by acme-fix" and not out["scanned"]  # nothing changed: the cached index
    shutil.rmtree(info)  # uninstalled: seen at the next start
    out, _ = probe(tmp_path, site)
    assert out["quirks"] == {} and out["run"] == "original" and out["scanned"]


def test_without_the_shim_nothing_is_patched(tmp_path, site):
    install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk())})
    out, _ = probe(tmp_path, site, env={"NRL_SHIM": "0"})
    assert out["run"] == "original" and out["quirks"] == {"acme-fix": "acme-quirks"}  # known, not applied


@pytest.mark.parametrize("other", ["another-dist", "builtin"])
def test_a_duplicate_id_is_one_error_naming_both_distributions(tmp_path, site, other):
    install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk())})
    if other == "builtin":
        install(site, "rogue-quirks", "rogue_quirks", {"vllm-refit-guard": ("fix", quirk("vllm-refit-guard"))})
        names = ("'nrl-shim'", "'rogue-quirks'")
    else:
        install(site, "other-quirks", "other_quirks", {"acme-fix": ("fix", quirk())})
        names = ("'acme-quirks'", "'other-quirks'")
    for _ in range(2):  # the start that scans, and the next one (the index written: start-up must not arm)
        _, proc = probe(tmp_path, site, check=False)
        assert proc.returncode == 2, proc.stderr  # at interpreter start-up (the .pth): one line, no traceback
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("nrl-shim: error: quirk id"), proc.stderr
        assert all(name in lines[0] for name in names), lines[0]


def test_a_plugin_that_fails_to_import_is_skipped_with_one_warning(tmp_path, site):
    install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk())})
    install(site, "broken-quirks", "broken_quirks", {"broken-fix": ("fix", "import no_such_module_anywhere\n")})
    for _ in range(2):  # the start that scans, and the next one (the index written: the warning again)
        out, proc = probe(tmp_path, site)
        assert out["quirks"] == {"acme-fix": "acme-quirks"} and out["run"] == "patched by acme-fix"
        warnings = [line for line in proc.stderr.splitlines() if "broken_quirks.fix" in line]
        assert len(warnings) == 1 and "'broken-quirks'" in warnings[0] and "ModuleNotFoundError" in warnings[0]
    _, proc = probe(tmp_path, site, env={"NRL_SHIM_STRICT": "1"}, check=False)
    assert proc.returncode == 2 and "broken_quirks.fix" in proc.stderr and "NRL_SHIM_STRICT=1" in proc.stderr


def test_an_entry_point_must_be_named_by_the_quirk_id(tmp_path, site):
    install(site, "acme-quirks", "acme_quirks", {"acme-misnamed": ("fix", quirk())})
    out, proc = probe(tmp_path, site)
    assert out["quirks"] == {} and "'acme-misnamed' but the module's ID is 'acme-fix'" in proc.stderr


def test_plugin_settings_are_parsed_and_validated_like_the_cores(tmp_path, site):
    install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk(settings=SETTING))})
    out, _ = probe(tmp_path, site, env={"NRL_ACME_WAIT": "2.5"})
    assert out["settings"] == {"acme_wait": 2.5}
    _, proc = probe(tmp_path, site, env={"NRL_ACME_WAIT": "soon"}, check=False)
    assert proc.returncode == 2 and "NRL_ACME_WAIT" in proc.stderr and "soon" in proc.stderr


def test_a_setting_declared_twice_is_one_error(tmp_path, site):
    clash = 'Variable("NRL_SHIM_STRICT", "acme_strict", None, False, "`1`", "clashes with the core"),'
    install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk(settings=clash))})
    _, proc = probe(tmp_path, site, check=False)
    assert proc.returncode == 2 and "NRL_SHIM_STRICT" in proc.stderr and "'nrl-shim'" in proc.stderr


def test_a_module_listed_in_nrl_shim_plugins_is_a_plugin_without_a_distribution(tmp_path, site):
    (site / "loose_quirk.py").write_text(quirk("loose-fix"))
    out, _ = probe(tmp_path, site, env={"NRL_SHIM_PLUGINS": "loose_quirk"})
    assert out["quirks"] == {"loose-fix": "NRL_SHIM_PLUGINS"} and out["run"] == "patched by loose-fix"


def test_an_edited_plugin_module_is_read_again_at_the_next_start(tmp_path, site):
    # An editable install: the module changes, no dist-info does. Start-up reads a plugin's record (id, targets) from
    # the index, so the index is stamped with each plugin file too.
    install(site, "acme-quirks", "acme_quirks", {"acme-fix": ("fix", quirk())})
    probe(tmp_path, site)
    out, _ = probe(tmp_path, site)
    assert not out["scanned"] and out["run"] == "patched by acme-fix"
    module = site / "acme_quirks" / "fix.py"
    module.write_text(quirk().replace('TARGETS = ("acme_target",)', 'TARGETS = ("acme_other",)'))
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later mtime, whatever the clock's grain
    (site / "acme_other.py").write_text("def run():\n    return 'original'\n")
    out, _ = probe(tmp_path, site, target=False)
    assert out["scanned"]
    proc = run_child(
        "plugin_probe",
        "--target",
        "acme_other",
        env={
            "NRL_SHIM": "1",
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join([SOURCE_ROOT, str(site)]),
        },
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1])["run"] == "patched by acme-fix"  # the new target
