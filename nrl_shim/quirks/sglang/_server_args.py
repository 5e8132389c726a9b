"""Which ServerArgs fields did the caller choose? nrl_shim.quirks._explicit_args wired to SGLang (not a quirk).

- The command line: `prepare_server_args(argv)` (`python -m sglang.launch_server`, `sglang serve`): the options the
  list names (a `--config` file: every field).
- Python: `ServerArgs(...)`'s keyword and positional arguments, on releases where ServerArgs is a dataclass (up to
  0.5.19; the record travels with the instance when it is pickled to a spawned server process, NeMo RL's way). From
  0.5.20 ServerArgs is a msgspec Struct, whose construction runs no Python code the tracker could wrap: a ServerArgs
  built in Python there has no record (`explicit()` is None: unknown), and a fix says so when it acts on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nrl_shim.quirks._explicit_args import ExplicitArgs, Patch, Unpatch, explicit, tracker_targets

__all__ = ("SERVER_ARGS", "explicit", "targets")

SERVER_ARGS = "sglang.srt.server_args"
TRACKER = ExplicitArgs("explicit-server-args")  # the layers' id: shared by every SGLang fix that uses it


def _track_server_args(module: ModuleType, quirk_id: str, attach: bool) -> None:
    server_args = module.ServerArgs
    if dataclasses.is_dataclass(server_args) and "__init__" in vars(server_args):
        _layer(server_args, "__init__", TRACKER.init_wrapper, quirk_id, attach)
    _layer(module, "prepare_server_args", TRACKER.parsed_wrapper, quirk_id, attach)


def _layer(owner: Any, name: str, wrapper: Callable[..., Any], quirk_id: str, attach: bool) -> None:
    if attach:
        TRACKER.attach(owner, name, wrapper, quirk_id)
    else:
        TRACKER.detach(owner, name, quirk_id)


def targets(quirk_id: str, own: dict[str, tuple[Patch, Unpatch]] | None = None) -> dict[str, tuple[Patch, Unpatch]]:
    """TARGETS for an SGLang fix that reads the caller's explicit server arguments (see vllm/_engine_args.targets)."""
    return tracker_targets({SERVER_ARGS: _track_server_args}, quirk_id, own)
