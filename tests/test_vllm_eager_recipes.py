"""vllm-eager-recipes: recipes that converge badly with CUDA graphs get enforce_eager=True.

Recipe detection and the pattern table are tested in-process and in small pure-Python children; the effect on the
REAL EngineArgs.create_engine_config() of this venv's vLLM in one fresh interpreter going through phases.
"""

import pytest
from packaging.version import Version

from nrl_shim.quirks.vllm.config import eager_recipes as quirk
from nrl_shim.registry import load_settings

from conftest import run_child_json
from vllm_helpers import VLLM_VERSION, build, cpu_env, model_dirs, requires_vllm

FLAGGED = [
    "grpo-deepscaler-1.5b-8K",
    "grpo-deepscaler-1.5b-16K",
    "grpo-deepscaler-1.5b-24K",
    "grpo-gspo-deepscaler-1.5b-8K",
]


@pytest.mark.parametrize(
    "argv, recipe",
    [
        (
            ["examples/run_grpo_math.py", "--config", "examples/configs/grpo-deepscaler-1.5b-8K.yaml"],
            "grpo-deepscaler-1.5b-8K",
        ),
        (
            [
                "run.py",
                "--config=/abs/any/folder/grpo-deepscaler-1.5b-24K.yaml",
                "policy.max_total_sequence_length=24576",
                "++cluster.num_nodes=2",
            ],
            "grpo-deepscaler-1.5b-24K",
        ),
        (
            ["run.py", "--config", "recipes/llm/grpo-gspo-deepscaler-1.5b-8K.yml", "grpo.num_prompts_per_step=64"],
            "grpo-gspo-deepscaler-1.5b-8K",
        ),
        (["run.py", "--config", "a.yaml", "--config", "b/grpo-deepscaler-1.5b-16K.yaml"], "grpo-deepscaler-1.5b-16K"),
        (["run.py", "policy.config=grpo-deepscaler-1.5b-8K.yaml"], None),
        (["run.py", "--config"], None),
        (["run.py"], None),
        ([], None),
    ],
)
def test_recipe_from_command_line(argv, recipe):
    assert quirk.recipe_from_argv(argv) == recipe


def test_flagged_recipes_and_user_patterns():
    settings = load_settings({"NRL_SHIM_EAGER_RECIPES": "my-*-recipe,exact-one"})
    for recipe in FLAGGED:
        assert "CUDA graphs" in quirk.eager_reason(recipe, settings)
    assert quirk.eager_reason("grpo-deepscaler-1.5b-8k", settings)  # recipe names compare case-insensitively
    assert quirk.eager_reason("my-long-recipe", settings) == "listed in NRL_SHIM_EAGER_RECIPES"
    assert quirk.eager_reason("exact-one", settings)
    for recipe in ("grpo-llama3.1-8b-instruct-1n8g", "grpo-deepscaler-1.5b-32K", "exact-one-more", "", None):
        assert quirk.eager_reason(recipe, settings) is None


def test_entry_point_group_adds_patterns(tmp_path):
    # A plugin distribution, as `pip install` would lay it out, declaring three entry points of the three shapes.
    (tmp_path / "myplugin.py").write_text(
        "ONE = 'team-a-*'\nMANY = ['team-b-1', 'team-b-2']\nREASONS = {'team-c-*': 'graphs break our reward model'}\n"
    )
    dist = tmp_path / "myplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{quirk.ENTRY_POINT_GROUP}]\none = myplugin:ONE\nmany = myplugin:MANY\nreasons = myplugin:REASONS\n"
        "broken = myplugin:MISSING\n"
    )
    out, proc = run_child_json("eager_recipes_entry_points", str(tmp_path), FLAGGED[0], env={"NRL_SHIM": "0"})
    assert out == {
        "team-a-x": "entry point one",
        "team-b-2": "entry point many",
        "team-c-y": "graphs break our reward model",
        "team-d": None,
        FLAGGED[0]: quirk.EAGER_RECIPES[FLAGGED[0]],
    }
    assert "entry point broken could not be loaded" in proc.stderr  # a broken plugin warns, never breaks


def test_detected_recipe_is_exported_to_children(tmp_path):
    # The driver's --config becomes NRL_SHIM_RECIPE, so subprocesses (and Ray workers, see ray-propagate-env) see it.
    out, _ = run_child_json(
        "eager_recipes_exported", "--config", "x/y/grpo-deepscaler-1.5b-16K.yaml", "a.b=1", env={"NRL_SHIM": "1"}
    )
    assert out == {
        "exported": "grpo-deepscaler-1.5b-16K",
        "child": ["grpo-deepscaler-1.5b-16K"] * 2,
        "after_deactivate": None,
    }
    # The user's NRL_SHIM_RECIPE wins over the command line; a name children could not parse is not exported.
    out, _ = run_child_json(
        "eager_recipes_exported",
        "--config",
        "grpo-deepscaler-1.5b-8K.yaml",
        env={"NRL_SHIM": "1", "NRL_SHIM_RECIPE": "mine"},
    )
    assert out["exported"] == "mine" and out["child"] == ["mine", "mine"]
    out, _ = run_child_json("eager_recipes_exported", "--config", "dir/my recipe.yaml", env={"NRL_SHIM": "1"})
    assert out == {"exported": None, "child": [None, None], "after_deactivate": None}


@requires_vllm
def test_real_engine_config(tmp_path):
    llama = model_dirs(tmp_path, ("llama",))["llama"]
    default = {"path": "engine_args", "model": llama}
    eager = {"path": "engine_args", "model": llama, "kwargs": {"enforce_eager": True}}
    base = dict(cpu_env(), NRL_SHIM="1")
    flagged_8k = "grpo-deepscaler-1.5b-8K"
    spec = {
        "phases": [
            {"cases": [default, {"path": "llm_positional", "model": llama}]},  # NRL_SHIM_RECIPE from the environment
            {
                "env": base,
                "argv": ["--config", "/cfg/grpo-deepscaler-1.5b-16K.yaml", "cluster.num_nodes=1"],
                "cases": [default],
            },  # detected from the command line at activation
            {"env": dict(base, NRL_SHIM_RECIPE="grpo-llama3.1-8b-instruct-1n8g"), "argv": [], "cases": [default]},
            {
                "env": dict(base, NRL_SHIM_RECIPE="my-long-recipe", NRL_SHIM_EAGER_RECIPES="my-*-recipe"),
                "cases": [default],
            },
            {"env": dict(base, NRL_SHIM_RECIPE="grpo-gspo-deepscaler-1.5b-8K"), "cases": [eager]},  # already eager
            {
                "env": dict(
                    base,
                    NRL_SHIM_RECIPE=flagged_8k,
                    NRL_SHIM_DISABLE=",".join(filter(None, [cpu_env().get("NRL_SHIM_DISABLE"), quirk.ID])),
                ),
                "cases": [default],
            },
        ]
    }
    out, proc = build(spec, env=dict(base, NRL_SHIM_RECIPE="grpo-deepscaler-1.5b-24K"))
    phases = out["phases"]
    for phase in phases:
        for r in phase["results"]:
            assert "error" not in r, r
            assert r["enforce_eager"] or not r["args_enforce_eager"], r  # the config follows the args
    eager_args = [[bool(r["args_enforce_eager"]) for r in p["results"]] for p in phases]  # None on 0.8.x = off
    assert eager_args == [[True, True], [True], [False], [True], [True], [False]]
    assert phases[1]["recipe_env"] == "grpo-deepscaler-1.5b-16K"
    before = "None" if Version("0.10") > VLLM_VERSION else "False"  # EngineArgs.enforce_eager defaults to None on 0.8.x
    for recipe in ("grpo-deepscaler-1.5b-24K", "grpo-deepscaler-1.5b-16K", "my-long-recipe"):
        assert proc.stderr.count(f"[{quirk.ID}] vllm enforce_eager for recipe {recipe}: {before} -> True") == 1
    for recipe in ("grpo-llama3.1-8b", "grpo-gspo-deepscaler-1.5b-8K", flagged_8k):  # untouched: no log line
        assert f"enforce_eager for recipe {recipe}" not in proc.stderr
