"""README's variable and quirk tables, generated from what the quirks declare (not on the start-up path)."""

from __future__ import annotations

from .registry import Quirk, quirks, variables
from .settings import Variable, as_text


def _default_text(variable: Variable) -> str:
    text = as_text(variable.default)
    return {"(unset)": "unset", "(none)": "none"}.get(text, f"`{text}`")


def _applies_to(quirk: Quirk) -> str:
    ranges = [f"{quirk.library} `{quirk.versions}`"] + [f"{lib} `{v}`" for lib, v in quirk.also_requires.items()]
    return ", ".join(ranges)


def markdown_tables() -> str:
    """README's variable and quirk tables, from the declarations (tests check README against this). After adding a
    quirk or a setting: python -c "from nrl_shim.docs import markdown_tables; print(markdown_tables())"."""
    lines = ["| variable | values | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{v.name}` | {v.accepted} | {_default_text(v)} | {v.meaning} |" for v in variables()]
    lines += ["", "| id | what | applies to | upstream |", "|---|---|---|---|"]
    lines += [f"| `{q.id}` | {q.summary} | {_applies_to(q)} | <{q.link}> |" for q in quirks()]
    return "\n".join(lines)
