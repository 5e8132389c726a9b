"""Which EngineArgs fields did the caller choose? nrl_shim.quirks._explicit_args wired to vLLM (not a quirk).

A fix that changes only what the caller left at vLLM's default builds its TARGETS with `targets(ID, own)`: the
tracker's modules (where EngineArgs/AsyncEngineArgs, vLLM's argument parser and LLM(...) are defined) and its own
{module name: (patch, unpatch)}; on a module in both, the tracker's layers go on first. It then reads
`explicit(engine_args)`: the field names the caller chose, or None for EngineArgs built before the shim was active.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from nrl_shim.quirks._explicit_args import ExplicitArgs, Patch, Unpatch, explicit, options_named, tracker_targets

__all__ = ("ARG_UTILS", "TRACKED", "explicit", "options_named", "targets")

ARG_UTILS = "vllm.engine.arg_utils"
# vllm.utils.argparse_utils (0.11.1+) or vllm.utils (before): FlexibleArgumentParser, whose parse_args is where the
# command line a server was started with (vllm serve's, verl's own argument list) can still be read.
PARSER_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")
# LLM(...) has parameters of its own (seed: default 0 on 0.27+) that it always passes to EngineArgs: whether its
# caller chose one is read there.
LLM_MODULE = "vllm.entrypoints.llm"

TRACKER = ExplicitArgs("explicit-engine-args")  # the layers' id: shared by every fix that uses it, not one's


def _engine_args_classes(module: ModuleType) -> list[type]:
    return [cls for cls in (module.EngineArgs, getattr(module, "AsyncEngineArgs", None)) if isinstance(cls, type)]


def _own_parser_class(module: ModuleType) -> type | None:
    # vllm.utils re-exports the class on releases that moved it to vllm.utils.argparse_utils: wrap it where defined.
    parser = vars(module).get("FlexibleArgumentParser")
    if isinstance(parser, type) and parser.__module__ == module.__name__ and "parse_args" in vars(parser):
        return parser
    return None


def _track_engine_args(module: ModuleType, quirk_id: str, attach: bool) -> None:
    for cls in _engine_args_classes(module):
        if "__init__" in vars(cls):
            _layer(cls, "__init__", TRACKER.init_wrapper, quirk_id, attach)
    _layer(module.EngineArgs, "from_cli_args", TRACKER.from_cli_args_wrapper, quirk_id, attach)


def _track_parser(module: ModuleType, quirk_id: str, attach: bool) -> None:
    parser = _own_parser_class(module)
    if parser is not None:
        _layer(parser, "parse_args", TRACKER.parse_args_wrapper, quirk_id, attach)


def _track_llm(module: ModuleType, quirk_id: str, attach: bool) -> None:
    if isinstance(getattr(module, "LLM", None), type):
        _layer(module.LLM, "__init__", TRACKER.front_door_wrapper, quirk_id, attach)


def _layer(owner: Any, name: str, wrapper: Callable[..., Any], quirk_id: str, attach: bool) -> None:
    if attach:
        TRACKER.attach(owner, name, wrapper, quirk_id)
    else:
        TRACKER.detach(owner, name, quirk_id)


TRACKED: dict[str, Callable[[ModuleType, str, bool], None]] = {
    ARG_UTILS: _track_engine_args,
    **dict.fromkeys(PARSER_MODULES, _track_parser),
    LLM_MODULE: _track_llm,
}


def targets(quirk_id: str, own: dict[str, tuple[Patch, Unpatch]] | None = None) -> dict[str, tuple[Patch, Unpatch]]:
    """TARGETS for a fix of `quirk_id` that reads the caller's explicit engine arguments: {module name: (patch,
    unpatch)} tracking them, followed on each module by the fix's `own` handlers for it (and its own modules)."""
    return tracker_targets(TRACKED, quirk_id, own)
