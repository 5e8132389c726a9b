"""Settings: every NRL_* variable parsed once; a bad value is one SettingsError naming variable, value, accepted."""

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from nrl_shim import SettingsError, ShimError
from nrl_shim.registry import load_settings, quirk_ids, variables

IDS = quirk_ids()
VARIABLES = [v.name for v in variables()]


def parse(**env):
    return load_settings(env)


def test_defaults():
    s = parse()
    assert s.enabled is None and s.disabled == frozenset() and s.strict is False
    assert s.log_level == 20 and s.recipe is None and s.eager_recipes == ()
    assert s.gemma_load_format == "always" and s.vllm_use_v1 is None and s.async_timeout_s == 600.0


@pytest.mark.parametrize(
    "env, attr, expected",
    [
        ({"NRL_SHIM": "1"}, "enabled", True),
        ({"NRL_SHIM": " off "}, "enabled", False),
        ({"NRL_SHIM_STRICT": "yes"}, "strict", True),
        ({"NRL_SHIM_LOG_LEVEL": "debug"}, "log_level", 10),
        ({"NRL_SHIM_RECIPE": "grpo-deepscaler-1.5b-8K"}, "recipe", "grpo-deepscaler-1.5b-8K"),
        ({"NRL_SHIM_EAGER_RECIPES": "my-*, other"}, "eager_recipes", ("my-*", "other")),
        ({"NRL_SHIM_GEMMA_LOAD_FORMAT": "Affected"}, "gemma_load_format", "affected"),
        ({"NRL_VLLM_USE_V1": "0"}, "vllm_use_v1", False),
        ({"NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "1.5"}, "async_timeout_s", 1.5),
        ({"NRL_SHIM_DISABLE": f" {IDS[0]} ,{IDS[1]},"}, "disabled", frozenset(IDS[:2])),
        ({"NRL_SHIM_DISABLE": "*"}, "disabled", frozenset({"*"})),
    ],
)
def test_valid_values(env, attr, expected):
    assert getattr(parse(**env), attr) == expected


@pytest.mark.parametrize(
    "name, raw, accepted",
    [
        ("NRL_SHIM", "maybe", "1 or 0"),
        ("NRL_SHIM_STRICT", "2", "1 or 0"),
        ("NRL_SHIM_LOG_LEVEL", "LOUD", "DEBUG, INFO"),
        ("NRL_SHIM_RECIPE", "two words", "without spaces"),
        ("NRL_SHIM_GEMMA_LOAD_FORMAT", "sometimes", "always | affected | off"),
        ("NRL_VLLM_USE_V1", "v2", "1 or 0"),
        ("NRL_VLLM_ASYNC_TIMEOUT_SECONDS", "-5", "positive"),
        ("NRL_VLLM_ASYNC_TIMEOUT_SECONDS", "nan", "positive"),
        ("NRL_VLLM_ASYNC_TIMEOUT_SECONDS", "ten", "positive"),
        ("NRL_SHIM_DISABLE", "*,vllm-v1-runtime", "* alone"),
    ],
)
def test_invalid_value_names_variable_value_and_accepted(name, raw, accepted):
    with pytest.raises(SettingsError) as info:
        parse(**{name: raw})
    message = str(info.value)
    assert name in message and repr(raw) in message and accepted in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, ShimError)


def test_unknown_quirk_id_lists_valid_ids():
    with pytest.raises(SettingsError) as info:
        parse(NRL_SHIM_DISABLE="vllm-v1-runtime,no-such-quirk")
    message = str(info.value)
    assert "unknown: no-such-quirk" in message
    assert all(quirk_id in message for quirk_id in IDS)
    assert (
        "vllm-rollout-sampling (= vllm-sampling-defaults, vllm-trainer-logprobs, vllm-strict-tool-calling)" in message
    )


def test_old_id_names_the_fixes_it_was_split_into():
    from nrl_shim.settings import ALIASES

    parts = ("vllm-sampling-defaults", "vllm-trainer-logprobs", "vllm-strict-tool-calling")
    assert ALIASES["vllm-rollout-sampling"] == parts and set(parts) <= set(IDS)
    s = parse(NRL_SHIM_DISABLE="vllm-rollout-sampling, vllm-replica-seed")
    assert s.disabled == frozenset({*parts, "vllm-replica-seed"})
    assert not any(s.is_enabled(part) for part in parts) and not s.is_enabled("vllm-rollout-sampling")
    one = parse(NRL_SHIM_DISABLE="vllm-strict-tool-calling")  # each part alone
    assert not one.is_enabled("vllm-strict-tool-calling") and one.is_enabled("vllm-trainer-logprobs")
    assert not one.is_enabled("vllm-rollout-sampling") and parse().is_enabled("vllm-rollout-sampling")


def test_settings_are_immutable():
    s = parse()
    with pytest.raises(AttributeError):
        s.strict = True


def test_quirk_enabled():
    s = parse(NRL_SHIM_DISABLE=IDS[0])
    assert not s.is_enabled(IDS[0]) and s.is_enabled(IDS[1])
    assert not any(parse(NRL_SHIM_DISABLE="*").is_enabled(q) for q in IDS)


# Environment values cannot contain NUL; anything else can reach us.
env_text = st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=40)


@hsettings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(VARIABLES)), raw=env_text)
def test_any_string_gives_a_setting_or_a_shim_error_naming_the_variable(name, raw):
    try:
        parse(**{name: raw})
    except ShimError as err:
        assert name in str(err)


@hsettings(max_examples=200, deadline=None)
@given(env=st.dictionaries(st.sampled_from(sorted(VARIABLES)), env_text, max_size=len(VARIABLES)))
def test_any_environment_gives_settings_or_one_shim_error(env):
    try:
        parse(**env)
    except ShimError as err:
        assert any(name in str(err) for name in env)


def test_a_setting_read_by_two_libraries_fixes_is_declared_outside_both():
    # One variable, one declaration: a quirk's own SETTINGS are read only by fixes of its library's folder
    # (nrl_shim/quirks/<lib>/); a setting that two libraries' fixes read (NRL_SHIM_LOGPROBS, NRL_SHIM_SAMPLING_DEFAULTS)
    # is declared in settings.ENGINE_VARIABLES, and read as `settings.<attr>`, never through a getattr default.
    import pathlib
    import re

    from nrl_shim import registry
    from nrl_shim.settings import ENGINE_VARIABLES, SHARED_VARIABLES

    root = pathlib.Path(registry.__file__).parent / "quirks"
    owner = {}  # attribute -> library folder of the quirk declaring it
    for quirk in registry.quirks():
        library = quirk.module_name.split(".")[2]
        owner.update({v.attr: library for v in quirk.settings})
    shared = {v.attr for v in SHARED_VARIABLES}
    readers: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        library = parts[0] if len(parts) > 1 else "quirks"  # a helper of every library's fixes (quirks/_trainer.py)
        text = path.read_text()
        assert not re.search(r"getattr\(settings, \"(logprobs|sampling_defaults)\"", text), path
        for attr in re.findall(r"\bsettings\.([a-z_0-9]+)\b", text):
            if attr in owner or attr in shared:
                readers.setdefault(attr, set()).add(library)
    for attr, libraries in readers.items():
        if attr in owner:
            assert libraries <= {owner[attr]}, f"settings.{attr} (declared by a {owner[attr]} fix) read in {libraries}"
    assert {"vllm", "sglang"} <= readers["logprobs"] and {"vllm", "sglang"} <= readers["sampling_defaults"]
    assert {v.attr for v in ENGINE_VARIABLES} == {"logprobs", "sampling_defaults", "probe"}
