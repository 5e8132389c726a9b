"""Shared real-SGLang runs of the SGLang fixes' tests (marker `sglang`, run without xdist): one HTTP server per shim
setting per test run (tests/children/sglang_server.py), every case of every fix on it in one order, each fix's test
module reading its cases' results. A server start costs 45-300 s here: one start, many cases.

Checkpoints: A (tiny Llama, seed 0), B (seed 1) and C (seed 2), each with a generation_config.json that says `top_k: 1` (what
sglang-sampling-defaults is about; native /generate does not read it, greedy cases are unaffected).
"""

import functools
import json
import os
import sys
import tempfile
from pathlib import Path

from conftest import child_path, run_case
from sglang_helpers import ENGINE_KW, reference, sglang_env, write_llama
from site_packages_hash import differences, site_packages, snapshot

PROMPT = [(i * 37) % 500 + 3 for i in range(300)]  # a long shared prefix, token ids of the tiny vocabulary
MAX_TOKENS = 8
RUNNING_PROMPT = [(i * 11) % 500 + 3 for i in range(100)]
RUNNING_TOKENS = 3000  # long enough to be running when the update comes (~10 s of decode here)
CONTEXT = 4096  # the server's context: the running requests' 100 + 3000 tokens
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "top_k": 1}

GROUP = 8  # a GRPO group: 8 chat completions of one prompt at temperature 1.0
_CHAT = {"messages": [{"role": "user", "content": "hello world"}], "temperature": 1.0, "max_tokens": 12}
CHAT_CASES = [
    ("chat_unset", {"kind": "chat", "n": GROUP, "body": _CHAT}),  # top_k/top_p left unset
    ("chat_request_top_k", {"kind": "chat", "n": GROUP, "body": {**_CHAT, "top_k": 1}}),  # the request's own
]

# Its own first token: a prompt that shares even one token with an earlier one would, without the shim, start from
# that token's KV of older weights (the radix bug itself) and spoil the logprob comparison.
SAMPLED_PROMPT = [499] + [(i * 13) % 500 + 3 for i in range(39)]
SAMPLING = {"temperature": 0.7, "top_p": 0.8}  # NeMo RL's request with its training-time top-p
SAMPLE_CASES = [("sampled_top_p", {"kind": "sample", "prompt": SAMPLED_PROMPT, "max_tokens": 16, "sampling": SAMPLING})]
SAMPLED_WEIGHTS = "B"  # the checkpoint the server holds when the sampled case runs

# A GRPO group of 8 requests of one prompt at temperature 1.0 (its own first token: no shared prefix), one at a time:
# with data parallelism each goes to the next rank, and no batching between them changes a rank's random draws.
GROUP_PROMPT = [498] + [(i * 7) % 500 + 3 for i in range(19)]
GROUP_CASES = [
    ("group_of_8", {"kind": "group", "prompt": GROUP_PROMPT, "n": GROUP, "max_tokens": 12, "one_at_a_time": True})
]

# The GPU given back and taken again as RL frameworks do between rollouts (all tags: weights, KV cache, CUDA graphs),
# without a CPU backup; a request before the refit, the refit (B again, with its flush), a request after it. Before the
# requests run while the update comes: without the shim 0.5.12.post1's server is gone after those.
SETTLE = {"kind": "settle", "seconds": 2}  # see settle_after_resume
RESUME_CASES = [
    ("settle_before_release", SETTLE),  # a release asserts an idle scheduler: none of the requests before left in it
    ("release", {"kind": "post", "path": "/release_memory_occupation", "body": {}}),
    ("resume", {"kind": "post", "path": "/resume_memory_occupation", "body": {}}),
    ("after_resume", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    # SGLang answers a request before its scheduler is idle again; an update's flush in that moment is refused (up to
    # 0.5.21 the scheduler asserts and the server dies), seen with the cores shared by another server: the update
    # comes once the scheduler had time to finish the request.
    ("settle_after_resume", SETTLE),
    ("update_after_resume", {"kind": "update_from_disk", "model_path": "B", "flush_cache": True}),
    ("after_resume_update", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
]

# The caller's own flush while requests run (NeMo RL's invalidate_kv_cache, its refit's flush after the buckets): after
# an update without flush (B again: the shim's cache then holds the prompt's KV of C, the weights before); once more
# after a caller's flush that went through, and after an update whose own flush did (nothing of earlier weights left
# either time: SGLang's answer, a refusal).
FLUSH_RUNNING = {"kind": "flush_while_running", "requests": 4, "prompt": RUNNING_PROMPT, "max_tokens": 1000}
FLUSH_CASES = [
    ("update_b_again_no_flush", {"kind": "update_from_disk", "model_path": "B", "flush_cache": False}),
    ("flush_running_after_update", FLUSH_RUNNING),
    ("after_flush_running", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("settle_before_flush_idle", SETTLE),  # idle: the request before done in the scheduler too
    ("flush_idle", {"kind": "post", "path": "/flush_cache", "body": {}}),
    ("flush_running_flushed", FLUSH_RUNNING),
    ("update_b_flushed", {"kind": "update_from_disk", "model_path": "B", "flush_cache": True}),
    ("flush_running_update_flushed", FLUSH_RUNNING),
]

# 0.5.21+: a weight-update session with no load in it (weights written in place by P2P/RDMA, which no CPU runs: here
# nothing is written), then the prompt served before. Older releases answer 404 (no sessions).
SESSION_CASES = [
    ("before_session", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("session_begin", {"kind": "post", "path": "/begin_weight_update", "body": {}}),
    ("session_end", {"kind": "post", "path": "/end_weight_update", "body": {}}),
    ("after_session", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
]

# Requests queued across an update: 4 decoding (each its own prompt, first tokens no other prompt has), the generation
# paused in SGLang's `retract` mode (back to the waiting queue, KV slots freed, the prompts' KV kept in the radix
# cache), an update to C without flush, the generation continued. Each request prefills again: from its prompt's KV of
# B (the weights before) without the shim; recomputed with C under it (its later tokens say which).
RETRACTED_PROMPTS = [[490 + i] + [(j * 17 + i) % 480 + 3 for j in range(99)] for i in range(4)]
RETRACT_CASES = [
    (
        "update_retracted",
        {
            "kind": "update_while_retracted",
            "requests": 4,
            "prompts": RETRACTED_PROMPTS,
            "max_tokens": 1000,
            "model_path": "C",
            "flush_cache": False,
        },
    ),
]

# A trainer's broadcast (update_weights_from_distributed over gloo, this process rank 0), to A without flush: the
# cache holds the prompt's KV of B (computed after the session cases), so without the shim the prompt comes from it.
DISTRIBUTED_CASES = [
    ("update_a_distributed", {"kind": "update_from_distributed", "model_path": "A", "flush_cache": False}),
    ("after_distributed", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
]

# Release and resume asked for twice (sglang-release-resume-idempotent), after everything else: A's weights held. The
# weights released twice, resumed, refilled by an update from disk (A, flushed), the prompt; then the KV cache alone
# released and every tag resumed (the weights never released: without the shim KeyError in the scheduler, the server
# gone), the prompt; a resume with nothing released, the prompt.
RELEASE_AGAIN_CASES = [
    ("settle_before_release_first", SETTLE),
    ("release_first", {"kind": "post", "path": "/release_memory_occupation", "body": {}}),
    ("release_again", {"kind": "post", "path": "/release_memory_occupation", "body": {}}),
    ("resume_after_release_again", {"kind": "post", "path": "/resume_memory_occupation", "body": {}}),
    ("update_after_release_again", {"kind": "update_from_disk", "model_path": "A", "flush_cache": True}),
    ("after_release_again", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("settle_before_release_kv", SETTLE),
    ("release_kv_only", {"kind": "post", "path": "/release_memory_occupation", "body": {"tags": ["kv_cache"]}}),
    ("resume_all_after_kv", {"kind": "post", "path": "/resume_memory_occupation", "body": {}}),
    ("after_resume_all", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("resume_unreleased", {"kind": "post", "path": "/resume_memory_occupation", "body": {}}),
    ("after_resume_unreleased", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
]

# Case names -> their index in the run: one order for every fix.
ORDER = [
    ("first", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("update_b_no_flush", {"kind": "update_from_disk", "model_path": "B", "flush_cache": False}),
    ("after_update", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("follower", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    *RESUME_CASES,
    # before the update while requests run: without the shim 0.5.12.post1's scheduler asserts there and the server dies
    *CHAT_CASES,
    *SAMPLE_CASES,
    (
        "update_c_running",
        {
            "kind": "update_while_running",
            "model_path": "C",  # not A: without the shim the radix cache still holds A's KV of the first request
            "requests": 4,
            "prompt": RUNNING_PROMPT,
            "max_tokens": RUNNING_TOKENS,
        },
    ),
    ("after_running_update", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    *FLUSH_CASES,
    *SESSION_CASES,
    *RETRACT_CASES,
    *DISTRIBUTED_CASES,
    *GROUP_CASES,  # without the shim 0.5.12.post1's server is gone by then (the data-parallel runs select it)
    *RELEASE_AGAIN_CASES,  # last: without the shim the server is gone after them
]


def down_at(run: dict, name: str) -> bool:
    """Whether the server of `run` was gone (or failed) at its case `name`: that case's result is an error."""
    result = run["results"][name]
    return "error" in result or result.get("status", 200) != 200


# Two ranks on this 2-core machine, one core each. Data parallelism: two scheduler processes, each with its own radix
# cache, requests spread round-robin. Tensor parallelism: two scheduler processes of one TP group (gloo on a CPU), one
# radix cache each, kept alike. SGLang's CPU build binds each rank to cores: per TP rank (SGLANG_CPU_OMP_THREADS_BIND
# as long as the TP size) in 0.5.12.post1; per DP x TP rank from its distributed/bootstrap.py on (0.5.23), where more
# ranks than NUMA nodes need the variable too.
PARALLEL = {"dp": ("--dp-size", "2"), "tp": ("--tp-size", "2")}


def _binds_every_rank():
    import importlib.util
    import os

    spec = importlib.util.find_spec("sglang")  # the package's folder, nothing of SGLang imported here
    return (
        spec is not None
        and spec.submodule_search_locations is not None
        and any(
            os.path.exists(os.path.join(folder, "srt", "distributed", "bootstrap.py"))
            for folder in spec.submodule_search_locations
        )
    )


def parallel_env(kind):
    """The server environment a two-rank server of `kind` ("dp", "tp") needs here (server_run's `env`)."""
    return (("SGLANG_CPU_OMP_THREADS_BIND", "0|1"),) if kind == "tp" or _binds_every_rank() else ()


def _server_args():
    args = []
    for key, value in ENGINE_KW.items():
        option = "--" + key.replace("_", "-")
        if value is True:
            args.append(option)
        else:
            args += [option, str(value)]
    # the 4 running requests (4 x 3100 tokens) next to the cached prompts; launch_server takes the last of an option.
    # The memory saver on, as NeMo RL, verl and slime start SGLang (torch_memory_saver's stand-in: tests/sglang_cpu).
    return [*args, "--max-total-tokens", "16384", "--context-length", str(CONTEXT), "--enable-memory-saver"]


@functools.cache
def checkpoints():
    root = Path(tempfile.mkdtemp(prefix="nrl-shim-sglang-"))
    out = {}
    for name, seed in (("A", 0), ("B", 1), ("C", 2)):
        directory = write_llama(root / name, seed=seed)
        (Path(directory) / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
        out[name] = directory
    return out


@functools.cache
def references():
    """transformers' greedy continuation of PROMPT with each checkpoint's weights."""
    return {name: reference(path, PROMPT, MAX_TOKENS) for name, path in checkpoints().items()}


@functools.cache
def server_run(
    shim: bool,
    args: tuple[str, ...] = (),
    names: tuple[str, ...] = (),
    launch: str = "cli",
    env: tuple[tuple[str, str | None], ...] = (),
    nemo_rl: str | None = None,
    order: str = "",
    slime: str | None = None,
    areal_config: str = "",
) -> dict:
    """The server child's output with the shim on (NRL_SHIM=1) or off, launch_server's options plus `args`, the cases
    of ORDER (or of `order`, [[name, case], ...] as JSON, hashable for the cache) named in `names` (default: all) in
    that order, started by `launch` (the child's routes: "cli", "spawn", "ray_actor"), with `env` added to the
    server's environment (a value of None: the variable unset); with `nemo_rl` (NeMo RL's source) the launching
    process imports NeMo RL's package first, as NeMo RL's own processes have it; `launch="slime"` starts it through
    slime's SGLangEngine from slime's source at `slime`; `launch="areal"`, AReaL's server and RemoteSGLangEngine with
    AReaL's SGLangConfig settings `areal_config` (JSON) over its defaults. Results by case name; the shared run under
    the shim (no argument but `shim`) also says what changed under site-packages (`site_packages_changed`)."""
    # The shared run under the shim (every fix's cases, CI's): the venv's site-packages hashed around it (~7 s each):
    # no fix, nor the harness, writes an installed file.
    shared = shim and launch == "cli" and not (args or names or env or order or nemo_rl or slime or areal_config)
    paths = checkpoints()
    order = [(name, case) for name, case in (json.loads(order) if order else ORDER) if not names or name in names]
    cases = []
    for _name, case in order:
        case = dict(case)
        if "model_path" in case:
            case["model_path"] = paths[case["model_path"]]
        cases.append(case)
    root = Path(tempfile.mkdtemp(prefix=f"nrl-shim-sglang-{'shim' if shim else 'plain'}-"))
    # NRL_SHIM_LOGPROBS=truncated: the trainer NeMo RL HEAD is (its top-p filter), without running NeMo RL here
    variables = sglang_env(
        {"NRL_SHIM": "1" if shim else "0", "NRL_SHIM_LOG_LEVEL": "INFO", "NRL_SHIM_LOGPROBS": "truncated", **dict(env)}
    )
    if nemo_rl:
        variables["PYTHONPATH"] = os.pathsep.join([variables["PYTHONPATH"], nemo_rl])
    run = {"model_path": paths["A"], "args": [*_server_args(), *args], "cases": cases, "launch": launch}
    if slime:
        run["slime"] = slime
    if areal_config:
        run["areal_config"] = json.loads(areal_config)
    installed = site_packages(sys.executable) if shared else []
    before = snapshot(roots=installed) if shared else {}
    out, _proc = run_case(
        child_path("sglang_server"),
        {**run, "nemo_rl": bool(nemo_rl)},
        root,
        env={k: v for k, v in variables.items() if v is not None},  # child_env drops every NRL_* it was not given
        timeout=1800,
    )
    results = {name: case["result"] for (name, _), case in zip(order, out["cases"])}
    if shared:
        out["site_packages_changed"] = differences(before, snapshot(roots=installed))
    print(
        f"SGLang {out['sglang']} server ({launch}, {'shim' if shim else 'no shim'}{', ' + ' '.join(args) if args else ''}): up in {out['start_s']} s, died: "
        f"{out['died']}; shim lines: {out['shim_lines']}",
        file=sys.stderr,
    )
    return {**out, "results": results}


# One `sglang.Engine` per shim setting (tests/children/sglang_engine.py), shared by the Engine route's tests of
# sglang-radix-cache-refit (tests/test_sglang_engine.py) and of sglang-weights-probe. Cases in order, on checkpoint A:
# the prompt (its KV enters the radix cache); B by update_weights_from_tensor with flush_cache=False (NeMo RL's and
# slime's per-bucket call, inside begin/end_weight_update on 0.5.21+); the prompt; flush_cache() (retried while
# refused, as NeMo RL does); the prompt; B again (a re-sync, with its flush); the prompt; update_weights_from_disk(A),
# the starting checkpoint reloaded over the synced weights; the prompt.
ENGINE_ORDER = [
    ("first", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("update", {"kind": "update_from_tensor", "checkpoint": "B", "flush_cache": False}),
    ("after_update", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("flush", {"kind": "flush_cache", "retry_s": 60}),
    ("after_flush", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("resync", {"kind": "update_from_tensor", "checkpoint": "B", "flush_cache": True}),
    ("after_resync", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("reload", {"kind": "update_from_disk", "checkpoint": "A"}),
    ("after_reload", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
]


@functools.cache
def engine_run(shim: bool) -> dict:
    """The Engine child's output with the shim on or off: results by case name, the shim's records in the driver
    (`shim_lines`), every line of the engine's processes (`stderr`), and what changed under site-packages."""
    paths = checkpoints()
    cases = [
        {**case, **({"checkpoint": paths[case["checkpoint"]]} if "checkpoint" in case else {})}
        for _, case in ENGINE_ORDER
    ]
    root = Path(tempfile.mkdtemp(prefix=f"nrl-shim-sglang-engine-{'shim' if shim else 'plain'}-"))
    installed = site_packages(sys.executable)
    before = snapshot(roots=installed)
    out, proc = run_case(
        child_path("sglang_engine"),
        {"engine": {"model_path": paths["A"], **ENGINE_KW}, "cases": cases},
        root,
        env=sglang_env({"NRL_SHIM": "1" if shim else "0"}),
        timeout=900,
    )
    shim_lines = [message for _level, message in out["start_log"]]
    shim_lines += [message for case in out["cases"] for _level, message in case["log"]]
    print(
        f"SGLang {out['sglang']}: engine start {out['engine_start_s']:.0f} s; shim active {out['shim_active']}, "
        f"its records: {shim_lines}",
        file=sys.stderr,
    )
    return {
        **out,
        "results": {name: case["result"] for (name, _), case in zip(ENGINE_ORDER, out["cases"])},
        "shim_lines": shim_lines,
        "stderr": proc.stderr,
        "site_packages_changed": differences(before, snapshot(roots=installed)),
    }
