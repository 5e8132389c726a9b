"""Which trainer runs in this process, for the fixes of any engine that return the trainer's logprobs (not a quirk;
stdlib only)."""

import importlib.util
import sys

# NeMo RL HEAD filters its training logits with the rollout's top-k/top-p (TrainingSamplingParams, apply_top_k_top_p
# in its policy workers): its trainer's logprobs are the truncated ones. Older NeMo RL (no such module) trains on all.
NEMO_RL_TRUNCATES = "nemo_rl.algorithms.logits_sampling_utils"


def trainer_truncates():
    """The framework in this process whose trainer filters its logits with top-k/top-p (its name), or None."""
    if "nemo_rl" not in sys.modules:
        return None
    try:
        return "NeMo RL" if importlib.util.find_spec(NEMO_RL_TRUNCATES) is not None else None
    except (ImportError, ValueError):
        return None
