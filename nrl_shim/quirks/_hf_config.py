"""Find a model's Hugging Face `model_type` without transformers and without the network.

NeMo RL asks transformers' AutoConfig (1.3 ms warm, seconds cold); we only need one string from config.json:
  * a local directory -> its config.json;
  * a hub id ("org/name") -> the snapshot of the requested revision in the local HF cache, laid out as
    huggingface_hub does (HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub);
  * hf_overrides (vLLM's dict, or its JSON text) may replace model_type.
Anything unknown or unreadable gives None: callers then leave the user's config alone.
Results are cached per process (a cached call is a dict lookup plus a few environment reads).
"""

import json
import os
import re

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_cache: dict = {}


def hub_cache_dir(environ=None):
    """The huggingface_hub cache directory the environment selects (same precedence as huggingface_hub)."""
    env = os.environ if environ is None else environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(os.path.expanduser(home), "hub")
    return os.path.expandvars(os.path.expanduser(cache))


def config_path(model, revision=None, environ=None):
    """Path of the config.json vLLM would read for `model` (local dir or cached hub id), or None when not on disk."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    model = os.fspath(model)
    if not isinstance(model, str) or "\0" in model:
        return None  # a PathLike of bytes; a NUL names no file (os.path.expanduser raises ValueError on it)
    local = os.path.expanduser(model)
    if os.path.isdir(local):
        path = os.path.join(local, "config.json")
        return path if os.path.isfile(path) else None
    if model.count("/") != 1 or model.startswith(("/", ".", "~")):
        return None  # not a hub id ("org/name") and not a directory: a file, a URL, a typo
    if revision is not None and not isinstance(revision, str):
        return None  # a number read from YAML, bytes ...: names no ref or commit here (vLLM reports it)
    repo_dir = os.path.join(hub_cache_dir(environ), "models--" + model.replace("/", "--"))
    revision = revision or "main"
    commit = revision if _COMMIT.match(revision) else _read_ref(repo_dir, revision)
    if commit is None:
        return None
    path = os.path.join(repo_dir, "snapshots", commit, "config.json")
    return path if os.path.isfile(path) else None


def _read_ref(repo_dir, revision):
    try:
        with open(os.path.join(repo_dir, "refs", revision)) as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def model_type(model, revision=None, hf_overrides=None):
    """config.json's model_type for `model` (after hf_overrides), or None when unknown. Cached per process.
    Never raises: any argument of any type, any file content, gives a str or None."""
    override = _override(hf_overrides)
    if override is not None:
        return override
    key = (
        model,
        revision,
        os.environ.get("HF_HUB_CACHE"),
        os.environ.get("HUGGINGFACE_HUB_CACHE"),
        os.environ.get("HF_HOME"),
        os.environ.get("XDG_CACHE_HOME"),
    )
    try:
        return _cache[key]
    except KeyError:
        found = _cache[key] = _read_model_type(config_path(model, revision))
        return found
    except TypeError:  # an unhashable argument (a list as revision ...): look it up, uncached
        return _read_model_type(config_path(model, revision))


def _read_model_type(path):
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            value = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: JSON nested too deeply
        return None
    return value if isinstance(value, str) else None


def _override(hf_overrides):
    # vLLM applies a dict with config.update(); a callable can do anything, so we cannot know its model_type.
    if isinstance(hf_overrides, str):
        try:
            hf_overrides = json.loads(hf_overrides)
        except (ValueError, RecursionError):
            return None
    if isinstance(hf_overrides, dict):
        value = hf_overrides.get("model_type")
        return value if isinstance(value, str) else None
    return None


def clear_cache():
    _cache.clear()
