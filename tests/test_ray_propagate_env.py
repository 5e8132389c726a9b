"""How ray.init's runtime_env gets the shim merged in (ray-propagate-env), field by field, without a cluster:
the user's fields are kept, what can't be merged is named in one warning (an error in strict mode)."""

import logging
import os
import subprocess
import sys

import pytest

from nrl_shim import report
from nrl_shim.errors import UnsupportedConfigError
from nrl_shim.quirks.ray import _ship as quirk  # the merge logic of ray-propagate-env
from nrl_shim.ray_worker import CHAINED_HOOK_VAR


@pytest.fixture
def log_lines():
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Keep()
    logger = report.logger()
    logger.addHandler(handler)
    report._seen.clear()
    yield lines
    logger.removeHandler(handler)
    report._seen.clear()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("NRL_", "RAY_JOB_CONFIG_JSON_ENV_VAR")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NRL_SHIM", "1")


def test_nothing_given_gets_package_hook_and_env_vars(log_lines):
    merged = quirk.merge_job_runtime_env(None, ship=True)
    assert merged["py_modules"] == [quirk.staged_package()]
    assert merged["worker_process_setup_hook"] == "nrl_shim.ray_worker.setup"
    assert merged["env_vars"] == {"NRL_SHIM": "1"}
    assert len(log_lines) == 3 and all(
        line.startswith("[ray-propagate-env] ray.init runtime_env[") for line in log_lines
    )


def test_user_fields_are_kept_and_their_hook_runs_after_ours():
    user = {
        "env_vars": {"A": "1", "NRL_SHIM": "1"},
        "py_modules": ["s3://bucket/pkg.zip"],
        "working_dir": "/w",
        "py_executable": "/venv/bin/python",
        "worker_process_setup_hook": "their.module.setup",
    }
    merged = quirk.merge_job_runtime_env(dict(user), ship=True)
    assert merged["py_modules"] == ["s3://bucket/pkg.zip", quirk.staged_package()]
    assert merged["working_dir"] == "/w" and merged["py_executable"] == "/venv/bin/python"
    assert merged["worker_process_setup_hook"] == "nrl_shim.ray_worker.setup"
    assert merged["env_vars"] == {"A": "1", "NRL_SHIM": "1", CHAINED_HOOK_VAR: "their.module.setup"}
    assert user["py_modules"] == ["s3://bucket/pkg.zip"]  # the caller's dict is not modified


def test_a_callable_hook_is_chained_by_a_named_callable():
    calls = []
    merged = quirk.merge_job_runtime_env({"worker_process_setup_hook": lambda: calls.append("user")}, ship=True)
    hook = merged["worker_process_setup_hook"]
    assert callable(hook) and hook.__name__ == "nrl_shim_setup_then_user_hook"  # Ray exports it under that name


def test_runtime_env_subclass_keeps_its_type():
    class RuntimeEnvLike(dict):
        pass

    merged = quirk.merge_job_runtime_env(RuntimeEnvLike(env_vars={"A": "1"}), ship=True)
    assert type(merged) is RuntimeEnvLike and merged["env_vars"]["A"] == "1"


def test_shipping_off_adds_env_vars_only():
    merged = quirk.merge_job_runtime_env({"py_modules": ["s3://b/p.zip"]}, ship=False)
    assert merged == {"py_modules": ["s3://b/p.zip"], "env_vars": {"NRL_SHIM": "1"}}


@pytest.mark.parametrize(
    "runtime_env, field",
    [
        ({"image_uri": "nvcr.io/some/image"}, "image_uri"),
        ({"py_modules": "s3://one/string.zip"}, "py_modules"),
        ({"worker_process_setup_hook": 42}, "worker_process_setup_hook"),
    ],
)
def test_unmergeable_field_warns_once_naming_it_and_the_job_still_starts(runtime_env, field, log_lines):
    merged = quirk.merge_job_runtime_env(dict(runtime_env), ship=True)
    quirk.merge_job_runtime_env(dict(runtime_env), ship=True)
    warnings = [line for line in log_lines if "Workers with their own Python get no shim" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"[ray-propagate-env] runtime_env[{field!r}]: ")
    assert merged == {**runtime_env, "env_vars": {"NRL_SHIM": "1"}}  # env_vars still travel


def test_unmergeable_field_is_an_error_in_strict_mode():
    with pytest.raises(UnsupportedConfigError, match=r"runtime_env\['image_uri'\].*NRL_SHIM_RAY_SHIP=0"):
        quirk.merge_job_runtime_env({"image_uri": "img"}, ship=True, strict=True)


def test_ray_jobs_submission_fields_are_not_duplicated(monkeypatch, log_lines):
    # Ray refuses to merge ray.init's runtime_env with the submission's when both set a field or env var.
    monkeypatch.setenv("NRL_VLLM_USE_V1", "1")
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR", '{"runtime_env": {"py_modules": ["gcs://x.zip"], "env_vars": {"NRL_SHIM": "1"}}}'
    )
    merged = quirk.merge_job_runtime_env(None, ship=True)
    assert merged == {"env_vars": {"NRL_VLLM_USE_V1": "1"}}
    assert any("runtime_env['py_modules']: set by the Ray Jobs submission" in line for line in log_lines)


def test_staged_package_brings_its_dependencies_and_works_without_site_packages(tmp_path):
    staged = quirk.staged_package()
    assert os.path.basename(staged) == "nrl_shim"
    assert os.path.isfile(os.path.join(staged, "_vendor", "wrapt", "__init__.py"))
    assert os.path.isfile(os.path.join(staged, "_vendor", "packaging", "version.py"))
    assert not any("__pycache__" in d for d, _, _ in os.walk(staged))
    # -S: no site-packages at all, so wrapt and packaging can only come from the shipped _vendor.
    code = (
        "import json, nrl_shim, wrapt, packaging; from nrl_shim.patching import wrap; "
        "print(json.dumps([nrl_shim.is_active(), wrapt.__file__, packaging.__file__]))"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": os.path.dirname(staged), "NRL_SHIM": "1"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    active, wrapt_file, packaging_file = __import__("json").loads(proc.stdout)
    assert active is True and wrapt_file.startswith(staged) and packaging_file.startswith(staged)
