"""Read a wheel's source for what each built-in fix declares it needs (REQUIRES): without installing it, so any
release can be checked the day it ships (`pip download --no-deps vllm==X -d DIR`, then this on the .whl).

    python tools/requires_in_wheel.py WHEEL [WHEEL ...]

Per fix whose LIBRARY (or an ALSO_REQUIRES library) the wheel is: each entry found or not (module file, then the
top-level name, then attributes in class bodies, incl. inherited from classes of the same module; parameters by name).
Exit 1 when something is missing. Static reading: what a class gets from another module is reported as not found.
"""

import ast
import sys
import zipfile

from nrl_shim import registry


def _members(tree):
    return (
        {
            node.name: node
            for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        }
        | {
            target.id: node
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.ImportFrom))
            for target in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)])
            if isinstance(target, ast.Name)
        }
        | {
            (alias.asname or alias.name): node
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
    )


def _class_members(node, classes):
    found = {}
    for base in node.bases:  # inherited from a class of the same module
        if isinstance(base, ast.Name) and isinstance(classes.get(base.id), ast.ClassDef):
            found.update(_class_members(classes[base.id], classes))
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[item.name] = item
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found[item.target.id] = item
        elif isinstance(item, ast.Assign):
            found.update({t.id: item for t in item.targets if isinstance(t, ast.Name)})
    return found


def _is_dataclass(node):
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _foreign_bases(node, classes):
    out = []
    for base in node.bases:
        if isinstance(base, ast.Name) and isinstance(classes.get(base.id), ast.ClassDef):
            out += _foreign_bases(classes[base.id], classes)
        else:
            out.append(ast.unparse(base))
    return out


def check(wheel, entry):
    module, _, rest = entry.partition(":")
    path, _, params = rest.partition("(")
    names = zipfile.ZipFile(wheel).namelist()
    file = next(
        (f for f in (module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py") if f in names), None
    )
    if file is None:
        return f"no module {module}"
    tree = ast.parse(zipfile.ZipFile(wheel).read(file))
    scope, node, owner = _members(tree), None, None
    classes = scope
    for part in path.split("."):
        node = scope.get(part)
        if node is None and part == "__init__" and isinstance(owner, ast.ClassDef) and _is_dataclass(owner):
            return None  # the dataclass decorator writes it
        if node is None and isinstance(owner, ast.ClassDef) and _foreign_bases(owner, classes):
            print(f"    (not read: {entry} may come from {', '.join(_foreign_bases(owner, classes))})")
            return None
        if node is None:
            return f"no {part} ({entry})"
        owner = node
        if isinstance(node, ast.ImportFrom):
            return None if part == path.split(".")[-1] else f"{part} is imported from elsewhere (not read) ({entry})"
        scope = _class_members(node, classes) if isinstance(node, ast.ClassDef) else {}
    if params and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        wanted = [p.strip() for p in params.rstrip(")").split(",") if p.strip()]
        args = node.args
        have = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
        if have[: len(wanted)] != wanted:
            return f"parameters {have[: len(wanted)]}, not {wanted} ({entry})"
    return None


def main(wheels):
    bad = 0
    for wheel in wheels:
        dist = wheel.rsplit("/", 1)[-1].split("-")[0].replace("_", "-").lower()
        print(wheel)
        for quirk in registry.quirks():
            libraries = {quirk.library, *quirk.also_requires}
            if not {dist, dist.removesuffix("-cpu")} & libraries or not quirk.requires:
                continue
            problems = [p for p in (check(wheel, e) for e in quirk.requires) if p]
            bad += bool(problems)
            print(f"  {quirk.id}: " + ("; ".join(problems) if problems else f"all {len(quirk.requires)} found"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
