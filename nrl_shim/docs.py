"""What is generated from the quirks' declarations (not on the start-up path): the Markdown tables of the docs (the quirk
table in README.md, the variable table in docs/settings.md) and nrl_shim/_quirk_index.py, what activation reads
instead of importing every quirk module (and a plugin-index scan, for the plan of an armed start-up).

The built-in quirks are the entry points of the group `nrl_shim.quirks` in pyproject.toml (read here with tomllib, so
the index is generated from a source checkout). After adding or changing a quirk or a setting: `python -m nrl_shim.docs`
rewrites the index and, in a checkout, the tables between their markers (`<!-- generated: NAME -->` ...
`<!-- end generated -->`), docs/quirks.md's contents and each section's "Applies to" line, and
sitecustomize_example/sitecustomize.py (a copy of nrl_shim/_bootstrap/sitecustomize.py); tests fail while any is stale. The tables and sections list the built-ins only (plugins document theirs).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import settings
from .plugins import GROUP
from .registry import BUILTIN, Quirk, _import, origin, quirks
from .settings import SHARED_VARIABLES, Variable, as_text

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def builtin_declarations(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """{quirk id: module} of nrl-shim's own quirks, in order: pyproject.toml's `[project.entry-points."nrl_shim.quirks"]`."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - pytest brings tomli on 3.10
        import tomli as tomllib
    with open(pyproject, "rb") as f:
        table = tomllib.load(f)["project"]["entry-points"][GROUP]
    return {name: value.partition(":")[0].strip() for name, value in table.items()}


def builtin_quirks() -> list[Quirk]:
    return [q for q in quirks() if origin(q.id) == BUILTIN]


def builtin_variables() -> list[Variable]:
    """The core's variables, then each built-in quirk's, in registry order (plugins' are documented by their packages)."""
    return [*SHARED_VARIABLES, *(v for q in builtin_quirks() for v in q.settings)]


def _default_text(variable: Variable) -> str:
    text = as_text(variable.default)
    return {"(unset)": "unset", "(none)": "none"}.get(text, f"`{text}`")


def _applies_to(quirk: Quirk) -> str:
    """Each library's bug range, its verified releases where they differ, and the upstream fix that ends the range."""
    ranges = []
    for lib, versions in {quirk.library: quirk.versions, **quirk.also_requires}.items():
        verified = quirk.verified.get(lib, versions)
        ranges.append(f"{lib} `{versions}`" + (f" (verified `{verified}`)" if verified != versions else ""))
    fixed = f"; fixed upstream: {quirk.fixed_by}" if quirk.fixed_by and quirk.fixed_by != quirk.link else ""
    return ", ".join(ranges) + fixed


def variables_table() -> str:
    """Every NRL_* variable (the core's, then each quirk's): docs/settings.md."""
    lines = ["| variable | values | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{v.name}` | {v.accepted} | {_default_text(v)} | {v.meaning} |" for v in builtin_variables()]
    return "\n".join(lines)


def quirks_table() -> str:
    """Every registered quirk, each id linking to its section of docs/quirks.md: README.md."""
    lines = ["| id | what | acts on (verified on) | upstream |", "|---|---|---|---|"]
    lines += [
        f"| [`{q.id}`](docs/quirks.md#{q.id}) | {q.summary} | {_applies_to(q)} | <{q.link}> |" for q in builtin_quirks()
    ]
    return "\n".join(lines)


def markdown_tables() -> str:
    """Both tables, variables then quirks."""
    return variables_table() + "\n\n" + quirks_table()


# The generated blocks: file (relative to the checkout) -> {block name: its text}. Each block sits between
# `<!-- generated: NAME (python -m nrl_shim.docs) -->` and `<!-- end generated -->`.
GENERATED: dict[str, dict[str, Callable[[], str]]] = {
    "README.md": {"quirks": quirks_table},
    "docs/settings.md": {"variables": variables_table},
}
CHECKOUT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) \(python -m nrl_shim\.docs\) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


def generated_blocks(text: str) -> dict[str, str]:
    """The generated blocks of a file's text: {name: body, without the markers}."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def render(text: str, blocks: dict[str, Callable[[], str]]) -> str:
    """`text` with each of its generated blocks rewritten (a block the file lacks is an error: add its markers)."""
    missing = set(blocks) - set(generated_blocks(text))
    if missing:
        raise ValueError(f"no markers for the generated block(s) {sorted(missing)}")

    def body(match: re.Match[str]) -> str:
        make = blocks.get(match["name"])
        return match.group(0) if make is None else match.group(1) + make() + "\n" + match.group(4)

    return _BLOCK.sub(body, text)


# ------------------------------------------------------------------------------------------------- docs/quirks.md
# One section per quirk, headed "## `<id>`", hand-written but for two generated parts: each section's "Applies to" and
# "Settings" lines (block `applies-<id>`) and the page's contents (block `contents`, from the page's own headings, so
# no entry is stale and every anchor resolves). A declared quirk without a section gets one (its summary and link, to
# be written out by hand); a section whose id is no longer declared is an error naming it.
QUIRK_PAGE = "docs/quirks.md"
_LIBRARY_NAMES = {"vllm": "vLLM", "ray": "Ray", "sglang": "SGLang"}
_SECTION = re.compile(r"^## `(?P<id>[\w.-]+)`$", re.M)
_HEADING = re.compile(r"^## (?P<title>.+)$", re.M)


def _marker(name: str) -> str:
    return f"<!-- generated: {name} (python -m nrl_shim.docs) -->\n"


def quirk_lines(quirk: Quirk) -> str:
    """A quirk's generated lines in docs/quirks.md: the versions it applies to (each library's bug range, the releases
    it is verified on where they differ, the upstream fix ending the range) and its settings."""
    ranges = []
    for lib, versions in {quirk.library: quirk.versions, **quirk.also_requires}.items():
        verified = quirk.verified.get(lib, versions)
        name = _LIBRARY_NAMES.get(lib, lib)
        ranges.append(f"{name} `{versions}`" + (f" (verified `{verified}`)" if verified != versions else ""))
    line = "**Applies to:** " + ", ".join(ranges)
    if quirk.fixed_by:
        line += f"; fixed upstream by <{quirk.fixed_by}>"
    line += "."
    if quirk.affected is not None and quirk.affected != quirk.versions:  # AFFECTED: where the bug exists
        line += f" The bug exists in `{quirk.affected}`."
    if quirk.not_affected:  # outside AFFECTED: nothing to fix
        line += f" Other releases: not affected ({quirk.not_affected})."
    if quirk.case:
        line += (
            f" Releases with the bug it does not reach: one warning, and {quirk.case} is named when it happens "
            "(strict mode: an error then)."
        )
    if quirk.settings:
        line += " **Settings:** " + ", ".join(f"[`{v.name}`](settings.md)" for v in quirk.settings)
    return line


def heading_anchor(title: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def quirk_page_contents(text: str) -> str:
    """The contents line of docs/quirks.md: every `## ` heading of the page, in order, linked to its anchor."""
    return "Contents: " + ", ".join(f"[{m['title']}](#{heading_anchor(m['title'])})" for m in _HEADING.finditer(text))


def quirk_page_sections(text: str) -> list[str]:
    """The quirk ids docs/quirks.md has a section for, in page order."""
    return [m["id"] for m in _SECTION.finditer(text)]


def _new_section(quirk: Quirk) -> str:
    return (
        f"## `{quirk.id}`\n\n{quirk.summary}\n\n{_marker('applies-' + quirk.id)}<!-- end generated -->\n\n"
        f"**Why:** <{quirk.link}>\n\n"
    )


def render_quirk_page(text: str, quirk_list: Iterable[Quirk] | None = None) -> str:
    """docs/quirks.md's text with a section added for each declared quirk that has none (after the last quirk
    section), each section's generated lines and the contents rewritten. ValueError names a section whose quirk is
    not declared (merge its text into the right section and delete it)."""
    declared = {q.id: q for q in (builtin_quirks() if quirk_list is None else quirk_list)}
    present = quirk_page_sections(text)
    stale = [quirk_id for quirk_id in present if quirk_id not in declared]
    if stale:
        raise ValueError(f"{QUIRK_PAGE}: section(s) for quirk(s) no longer declared: {stale}; merge and delete them")
    missing = [q for quirk_id, q in declared.items() if quirk_id not in present]
    if missing:
        sections = list(_SECTION.finditer(text))
        after = _HEADING.search(text, sections[-1].end()) if sections else None
        at = after.start() if after else len(text)
        text = text[:at] + "".join(_new_section(q) for q in missing) + text[at:]
    blocks: dict[str, Callable[[], str]] = {
        f"applies-{quirk_id}": functools.partial(quirk_lines, q) for quirk_id, q in declared.items()
    }
    text = render(text, blocks)
    return render(text, {"contents": lambda: quirk_page_contents(text)})


# ------------------------------------------------------------------------------------------ sitecustomize_example/
# The sitecustomize.py a user copies into an image that can't use the .pth is the package's own start-up hook for such
# interpreters, written out with a header: one text to maintain, and the copy works without the package's files.
BOOTSTRAP = Path(__file__).resolve().parent / "_bootstrap" / "sitecustomize.py"
SITECUSTOMIZE_EXAMPLE = "sitecustomize_example/sitecustomize.py"
_EXAMPLE_HEADER = (
    "# nrl-shim's start-up hook for an image without nrl_shim.pth: copy this file into a directory of its own at the\n"
    "# front of sys.path (see README.md here). Written by `python -m nrl_shim.docs` from\n"
    "# nrl_shim/_bootstrap/sitecustomize.py (edit that one; tests fail while this copy differs).\n"
)


def sitecustomize_example_source() -> str:
    """The text of sitecustomize_example/sitecustomize.py: the header, then nrl_shim/_bootstrap/sitecustomize.py."""
    return _EXAMPLE_HEADER + BOOTSTRAP.read_text()


def write_generated_docs(root: Path = CHECKOUT) -> list[str]:
    """Rewrite the generated tables of the docs in a checkout (nothing in an installed package); the files changed."""
    changed: list[str] = []
    if not (root / "pyproject.toml").is_file():
        return changed  # an installed copy: its parent directory is site-packages, not a checkout
    for name, blocks in GENERATED.items():
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text()
        new = render(text, blocks)
        if new != text:
            path.write_text(new)
            changed.append(name)
    example = root / SITECUSTOMIZE_EXAMPLE
    if example.parent.is_dir():
        source = sitecustomize_example_source()
        if not example.is_file() or example.read_text() != source:
            example.write_text(source)
            changed.append(SITECUSTOMIZE_EXAMPLE)
    page = root / QUIRK_PAGE
    if page.is_file():
        text = page.read_text()
        new = render_quirk_page(text)
        if new != text:
            page.write_text(new)
            changed.append(QUIRK_PAGE)
    return changed


# ------------------------------------------------------------------------------------------------- the quirk index
INDEX_PATH = Path(__file__).resolve().parent / "_quirk_index.py"
_INDEX_DOC = '''"""Generated by `python -m nrl_shim.docs` from pyproject.toml's `nrl_shim.quirks` entry points: do not edit.

What activation needs before any target is imported, so that a quirk's module is imported only when one of its targets
is (or when the version gate, doctor or docs need the rest). Per quirk: (module, id, target modules, setup condition:
None without setup(), else its SETUP_ARGV or "" for every process, SETTINGS). tests/test_quirk_index.py fails when this
file is not what the modules declare.
"""
'''


def _string(text: str) -> str:
    # Double quotes as the formatter writes them, unless the text holds some (then repr's single quotes escape less).
    source = repr(text)
    if source.startswith("'") and '"' not in text:
        source = '"' + source[1:-1].replace("\\'", "'") + '"'
    return source


def _value(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    raise ValueError(f"cannot write {value!r} into the quirk index: use a plain str, number, bool, None or tuple")


def _parser(parse: Any, used: set[str]) -> str:
    """The source of a setting's parser: a function of nrl_shim.settings, or a settings.choice."""
    if parse is None:
        return "None"
    if isinstance(parse, settings.choice):
        used.add("choice")
        return "choice(" + ", ".join(_string(c) for c in parse.choices) + ")"
    name = getattr(parse, "__name__", "")
    if getattr(settings, name, None) is parse:
        used.add(name)
        return name
    raise ValueError(
        f"{parse!r}: a quirk's setting must be parsed by a parser of nrl_shim.settings (the index, read at every "
        "activation, imports only that module)"
    )


def _variable(variable: Variable, used: set[str], indent: str) -> str:
    used.add("Variable")
    fields = [
        _string(variable.name),
        _string(variable.attr),
        _parser(variable.parse, used),
        _value(variable.default),
        _string(variable.accepted),
        _string(variable.meaning),
    ]
    inner = indent + "    "
    return f"{indent}Variable(\n" + "".join(f"{inner}{field},\n" for field in fields) + f"{indent}),\n"


def _names(names: tuple[str, ...], indent: str) -> str:
    one_line = _value(names)
    if len(indent) + len(one_line) + 1 <= 120:
        return f"{indent}{one_line},\n"
    return f"{indent}(\n" + "".join(f"{indent}    {_string(n)},\n" for n in names) + f"{indent}),\n"


def quirk_index_source(modules: Iterable[str] | None = None) -> str:
    """The text of nrl_shim/_quirk_index.py for `modules` (default: the built-in quirks; imports each of them)."""
    declared = builtin_declarations() if modules is None else {}
    modules_by_id = {module: quirk_id for quirk_id, module in declared.items()}
    if modules is None:
        modules = declared.values()
    used: set[str] = set()
    entries = []
    for name in modules:
        quirk = Quirk(_import(name))
        if modules_by_id.get(name, quirk.id) != quirk.id:  # the entry point's name is the quirk's ID, as for plugins
            raise ValueError(
                f"pyproject.toml: entry point {modules_by_id[name]!r} = {name!r}, whose ID is {quirk.id!r}"
            )
        entry = "    (\n"
        entry += f"        {_string(quirk.module_name)},\n        {_string(quirk.id)},\n"
        entry += _names(quirk.targets, "        ")
        entry += f"        {_value(quirk.setup_argv)},\n"
        if quirk.settings:
            entry += (
                "        (\n" + "".join(_variable(v, used, "            ") for v in quirk.settings) + "        ),\n"
            )
        else:
            entry += "        (),\n"
        entries.append(entry + "    ),\n")
    imports = ""
    if used:
        names = ["Variable", *sorted(used - {"Variable"})]
        imports = f"\nfrom .settings import {', '.join(names)}\n"
    # Targets with a hook run before the module executes (PRE_TARGETS): (module name, quirk id).
    pre = "".join(
        f"    ({_string(target)}, {_string(quirk.id)}),\n"
        for quirk in (Quirk(_import(name)) for name in modules)
        for target in getattr(quirk.module, "PRE_TARGETS", {})
    )
    # Setups an armed start-up defers to a metadata lookup (SETUP_DISTRIBUTION): (quirk id, distribution name).
    deferred = "".join(
        f"    ({_string(quirk.id)}, {_string(quirk.module.SETUP_DISTRIBUTION)}),\n"
        for quirk in (Quirk(_import(name)) for name in modules)
        if quirk.setup is not None and getattr(quirk.module, "SETUP_DISTRIBUTION", None)
    )
    return (
        _INDEX_DOC
        + imports
        + "\n# fmt: off\nQUIRKS = (\n"
        + "".join(entries)
        + ")\n# Per PRE_TARGETS entry (run before the module executes): (module name, quirk id).\nPRE_TARGETS = (\n"
        + pre
        + ")\n# Per setup() an armed start-up defers to a metadata lookup (SETUP_DISTRIBUTION): (quirk id, name).\n"
        + "SETUP_DISTRIBUTIONS = (\n"
        + deferred
        + ")\n# fmt: on\n"
    )


def write_quirk_index(path: Path = INDEX_PATH) -> bool:
    """Rewrite the quirk index from the quirk modules; True when it changed. Only in a checkout: the built-ins are
    read from pyproject.toml, which an installed copy does not have (its index is the one it was built with)."""
    if not PYPROJECT.is_file():
        return False
    source = quirk_index_source()
    if path.is_file() and path.read_text() == source:
        return False
    path.write_text(source)
    return True


if __name__ == "__main__":
    changed = write_quirk_index()
    sys.stdout.write(f"{INDEX_PATH}: {'rewritten' if changed else 'up to date'}\n")
    for name in write_generated_docs():
        sys.stdout.write(f"{CHECKOUT / name}: generated parts rewritten\n")
