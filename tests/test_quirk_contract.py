"""The patcher contract, checked for every built-in quirk with the same pytest plugin a plugin package runs over its
own quirks (nrl_shim.testing.QuirkContract, ddtrace's PatchTestCase idea): a new quirk gets these checks by being
registered. Each runs in fresh interpreters (python -m nrl_shim.testing.contract_child) against the real libraries of
this venv; a quirk whose library is absent or out of range here is skipped with the reason."""

import re
from pathlib import Path

import pytest

from nrl_shim import registry
from nrl_shim.testing import QuirkContract

from conftest import SOURCE_ROOT

HERE = Path(__file__).resolve().parent


class TestBuiltinQuirks(QuirkContract):
    quirk_modules = list(registry.QUIRK_MODULES)


def test_every_quirk_module_is_registered_and_has_a_test_module():
    # Quirks live at any depth (quirks/<library>/<topic>/<name>.py); `_`-named modules and packages are helpers.
    package = Path(SOURCE_ROOT) / "nrl_shim" / "quirks"
    modules = {
        ".".join(("nrl_shim", "quirks", *p.relative_to(package).with_suffix("").parts))
        for p in package.rglob("*.py")
        if not any(part.startswith("_") for part in p.relative_to(package).parts)
    }
    assert modules == set(registry.QUIRK_MODULES)
    for quirk_id in registry.quirk_ids():
        if registry.origin(quirk_id) != registry.BUILTIN:
            continue
        test_module = f"test_{quirk_id.replace('-', '_')}.py"  # named after the id users know, not the module's path
        assert (HERE / test_module).is_file(), f"{quirk_id} has no tests/{test_module}"


def test_docs_tables_are_the_declarations():
    # The generated tables (quirks in README.md, variables in docs/settings.md) are exactly what the declarations give.
    from nrl_shim.docs import GENERATED, generated_blocks

    for name, blocks in GENERATED.items():
        found = generated_blocks((Path(SOURCE_ROOT) / name).read_text())
        for block, make in blocks.items():
            assert found.get(block) == make() + "\n", (
                f"{name}: the generated table {block!r} is out of date: run `python -m nrl_shim.docs`"
            )


def test_quirk_page_has_a_section_per_quirk_with_its_generated_lines():
    # docs/quirks.md: one section per declared quirk (none for an undeclared one), its "Applies to" line what the
    # declaration gives, the contents every heading of the page and nothing else, each link to an anchor that exists.
    from nrl_shim import docs

    text = (Path(SOURCE_ROOT) / docs.QUIRK_PAGE).read_text()
    declared = [q.id for q in docs.builtin_quirks()]
    assert sorted(docs.quirk_page_sections(text)) == sorted(declared)
    found = docs.generated_blocks(text)
    for quirk in docs.builtin_quirks():
        assert found.get(f"applies-{quirk.id}") == docs.quirk_lines(quirk) + "\n", (
            f"{docs.QUIRK_PAGE}: {quirk.id}'s generated lines are out of date: run `python -m nrl_shim.docs`"
        )
    assert docs.render_quirk_page(text) == text, f"{docs.QUIRK_PAGE} is out of date: run `python -m nrl_shim.docs`"
    anchors = {docs.heading_anchor(m["title"]) for m in docs._HEADING.finditer(text)}
    linked = re.findall(r"\]\(#([^)]+)\)", found["contents"])
    assert set(linked) == anchors and len(linked) == len(anchors)
    assert {f"{quirk_id}" for quirk_id in declared} <= set(linked)


def test_quirk_page_adds_a_section_for_a_new_quirk_and_names_a_stale_one():
    from nrl_shim import docs

    quirk, other = docs.builtin_quirks()[:2]
    text = (
        "# The quirks\n\n<!-- generated: contents (python -m nrl_shim.docs) -->\n<!-- end generated -->\n\n"
        f"## `{quirk.id}`\n\nby hand\n\n<!-- generated: applies-{quirk.id} (python -m nrl_shim.docs) -->\nold\n"
        "<!-- end generated -->\n\n## What the log says\n\nkept\n"
    )
    out = docs.render_quirk_page(text, [quirk, other])
    assert docs.quirk_page_sections(out) == [quirk.id, other.id]
    assert out.index(f"## `{other.id}`") < out.index("## What the log says")
    assert docs.generated_blocks(out)[f"applies-{other.id}"] == docs.quirk_lines(other) + "\n"
    assert docs.generated_blocks(out)["contents"] == (
        f"Contents: [`{quirk.id}`](#{quirk.id}), [`{other.id}`](#{other.id}), [What the log says](#what-the-log-says)\n"
    )
    assert docs.render_quirk_page(out, [quirk, other]) == out
    with pytest.raises(ValueError, match=f"no longer declared: \\['{quirk.id}'\\]"):
        docs.render_quirk_page(text, [other])


def test_docs_generation_rewrites_only_the_blocks(tmp_path):
    from nrl_shim.docs import render

    text = "# t\n\n<!-- generated: quirks (python -m nrl_shim.docs) -->\nold\n<!-- end generated -->\n\nkept\n"
    out = render(text, {"quirks": lambda: "| new |"})
    assert (
        out == "# t\n\n<!-- generated: quirks (python -m nrl_shim.docs) -->\n| new |\n<!-- end generated -->\n\nkept\n"
    )
    with pytest.raises(ValueError, match="no markers"):
        render("no markers here", {"quirks": lambda: "x"})


def test_pre_targets_are_targets_and_carried_in_the_index():
    """PRE_TARGETS (hooks run before a target module executes): each a declared target with a callable, and the
    generated index lists them so activation knows them without importing the quirk modules."""
    from nrl_shim import _quirk_index

    declared = []
    for quirk in registry.quirks():
        hooks = getattr(quirk.module, "PRE_TARGETS", {})
        assert isinstance(hooks, dict), quirk.id
        for name, before in hooks.items():
            assert name in quirk.targets and callable(before), (quirk.id, name)
            declared.append((name, quirk.id))
    assert tuple(declared) == _quirk_index.PRE_TARGETS == registry._pre_entries()


def test_variables_are_declared_once():
    names = [v.name for v in registry.variables()]
    assert len(names) == len(set(names)), names
