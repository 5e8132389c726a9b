"""What the tests of NeMo RL's own code share (tests/test_nemo_rl_f963.py, tests/test_nemo_rl_head.py): finding a
clone of NeMo RL at a given commit, transformers' reference tokens cut as NeMo RL's generation stops, and a separate
Ray cluster with one logical GPU."""

import json
import os
import shutil
import subprocess
from contextlib import contextmanager

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared")


def nemo_rl_source(commit, variable, marker):
    """(directory, None) when NeMo RL's source at `commit` is there (the variable, else ../shared/nemo-rl/<commit[:9]>
    beside this checkout; `marker` is a file it must hold), else (None, why not and how to get it)."""
    given = os.environ.get(variable)
    default = os.path.join(SHARED, "nemo-rl", commit[:9])
    directory = given or default
    how = f"{variable}={given}" if given else f"{variable} is not set and {default}"
    if not os.path.isfile(os.path.join(directory, marker)):
        return None, (
            f"needs NeMo RL's source at commit {commit[:9]} ({how} holds no {marker}): "
            f"`git clone https://github.com/NVIDIA-NeMo/RL && git -C RL checkout {commit}`, then set {variable}"
        )
    if os.path.isdir(os.path.join(directory, ".git")):
        head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.stdout.strip() != commit:
            return None, (
                f"{how}: the clone is at {head.stdout.strip() or head.stderr.strip()!r}, not NeMo RL {commit}: "
                f"`git -C {directory} checkout {commit}`"
            )
    return directory, None


def reference_tokens(model, prompts, max_new_tokens):
    """transformers' greedy tokens (float32), cut after the first stop token as NeMo RL's generation stops (its
    config's stop_token_ids: the tokenizer's eos)."""
    from transformers import AutoTokenizer

    from tiny_models import greedy_tokens

    eos = AutoTokenizer.from_pretrained(model).eos_token_id
    return [
        tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
        for tokens in greedy_tokens(model, prompts, max_new_tokens)
    ]


@contextmanager
def one_gpu_cluster():
    """A separately started Ray cluster (tests/ray_cluster.py) with one logical GPU for NeMo RL's GPU placement group
    and `ray.get_gpu_ids()` (nothing uses CUDA); its temp dir removed after it stopped."""
    from ray_cluster import SeparateCluster

    with SeparateCluster(num_cpus=2, env={"RAY_OVERRIDE_RESOURCES": json.dumps({"GPU": 1})}) as running:
        yield running
    shutil.rmtree(running.temp_dir, ignore_errors=True)
