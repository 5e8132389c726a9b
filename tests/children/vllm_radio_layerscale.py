"""vLLM's REAL RADIO vision encoder (vllm.model_executor.models.radio.RadioModel) built and loaded on CPU through
vLLM's own loaders, for the vllm-radio-layerscale tests. Prints one JSON line.

    python vllm_radio_layerscale.py DIR    # every case below, in this interpreter (shim on or off by env)

It first writes two tiny checkpoints, DIR/explicit (non-identity ls1/ls2) and DIR/folded (no LayerScale), unless
they are there (`--write DIR` writes only them).

RadioModel is not a model vLLM serves on its own: Nemotron Nano VL (NemotronH_Nano_VL_V2) holds it as
`vision_model`, behind a Mamba-hybrid language model this machine cannot build. In its place the harness registers,
through vLLM's out-of-tree model API (ModelRegistry.register_model), `NrlShimRadioTower`: a parent module that holds
a real RadioModel as `vision_model` and hands it its weights exactly as NemotronH_Nano_VL_V2.load_weights does (names
`vision_model.radio_model.*` -> `radio_model.*`, one `vision_model.load_weights(list)` call per load, returns None).
Everything else is vLLM's: EngineArgs.create_engine_config(), the auto/dummy loaders (and so the refit guard's hooks),
RadioModel's construction, load_weights, post-load processing and forward.

Cases (each a fresh model):
- explicit/auto: the checkpoint's ls1/ls2 (non-identity) vs the loaded ones; the encoder's output vs the reference:
  the same model with the checkpoint's ls1/ls2 written into it by hand (every other weight as vLLM loaded it);
- folded/dummy + refit: LayerScale absent from the checkpoint (folded into the weights): ls1/ls2 vs initializer_factor;
- explicit/dummy + refit, then a second refit call with a bucket without LayerScale: ls1/ls2 vs the checkpoint's;
- explicit/dummy + refit: the refit guard's warnings at the next generation step (the encoder's forward).
The dummy cases refit through `model.load_weights(items)` as RL frameworks do; on the CPU build that needs the shim's
vllm-cpu-refit (live linear weights), so they run only when the shim is active.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARCH = "NrlShimRadioTower"
INITIALIZER_FACTOR = 0.5  # not 1.0: "left at initializer_factor" must be told apart from other values
LAYERS = 2
RADIO = {"hidden_size": 32, "num_hidden_layers": LAYERS, "num_attention_heads": 2, "intermediate_size": 64}


def radio_config():
    from vllm.transformers_utils.configs.radio import RadioConfig

    config = RadioConfig(
        "vit_small_patch16_224", image_size=32, patch_size=16, cpe_max_size=32, initializer_factor=INITIALIZER_FACTOR
    )
    for name, value in RADIO.items():  # the tiny encoder (the named timm size only sets these four)
        setattr(config, name, value)
    return config


def tower_class():
    import torch.nn as nn
    from vllm.model_executor.models.radio import RadioModel

    class NrlShimRadioTower(nn.Module):
        """Harness parent of a real RadioModel (see the module docstring)."""

        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()
            self.vision_model = RadioModel(config=radio_config())

        def forward(self, input_ids=None, positions=None, pixel_values=None):  # vLLM's model interface, then ours
            return self.vision_model(pixel_values)[1]

        def compute_logits(self, hidden_states):
            return hidden_states

        def embed_input_ids(self, input_ids):
            raise NotImplementedError

        def load_weights(self, weights):
            vision = [(name[len("vision_model.") :], w) for name, w in weights if name.startswith("vision_model.")]
            self.vision_model.load_weights(vision)  # as NemotronH_Nano_VL_V2 does: one call, returns None

    return NrlShimRadioTower


def _platform():
    if not _PLATFORM:
        _PLATFORM.extend(_set_up())
    return _PLATFORM


_PLATFORM = []


def _set_up():
    from vllm_model_objects import _cpu_runner_setup, _init_distributed, use_cpu_platform

    platform = use_cpu_platform()
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCH, tower_class())
    _cpu_runner_setup()

    def init_distributed():  # once per process (several models are built here)
        from vllm.distributed.parallel_state import model_parallel_is_initialized

        if not model_parallel_is_initialized():
            _init_distributed()

    return platform, init_distributed


def write(directory):
    """Two checkpoints of the tiny tower: `explicit` with ls1/ls2 != initializer_factor, `folded` without them."""
    import torch
    from safetensors.torch import save_file

    _, init_distributed = _platform()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.radio import RadioModel

    with set_current_vllm_config(VllmConfig()):
        init_distributed()
        shapes = {n: p.shape for n, p in RadioModel(config=radio_config()).named_parameters()}
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        if name.startswith("model.encoder.layers."):  # vLLM's name -> the checkpoint's (RADIO's own, timm blocks)
            hf = "radio_model.model.blocks." + name[len("model.encoder.layers.") :]
        else:
            hf = "radio_model." + name
        if name.endswith((".ls1", ".ls2")):
            value = 0.2 + 1.8 * torch.rand(shape, generator=generator)  # non-identity LayerScale
        elif name.endswith(".bias") or "norm" in name:
            value = 0.1 * torch.randn(shape, generator=generator) + (1.0 if name.endswith("weight") else 0.0)
        else:
            value = 0.2 * torch.randn(shape, generator=generator)
        tensors["vision_model." + hf] = value.contiguous()
    config = {
        "architectures": [ARCH],
        "model_type": "llama",  # a config class transformers knows; the tower reads its own RADIO config
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 128,
        "torch_dtype": "float32",
    }
    for kind in ("explicit", "folded"):
        path = os.path.join(directory, kind)
        os.makedirs(path, exist_ok=True)
        kept = {n: t for n, t in tensors.items() if kind == "explicit" or not n.endswith((".ls1", ".ls2"))}
        save_file(kept, os.path.join(path, "model.safetensors"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
    return {"written": directory, "tensors": len(tensors)}


def build(model_dir, load_format, init_distributed):
    import inspect

    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_model_objects import engine_config

    vllm_config = engine_config(model_dir, load_format)
    context = set_current_vllm_config(vllm_config)
    context.__enter__()  # left set: layers look the config up at forward time on some releases
    init_distributed()
    loader = get_model_loader(vllm_config.load_config)
    if "model_config" in inspect.signature(loader.load_model).parameters:
        return loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
    return loader.load_model(vllm_config=vllm_config)


def checkpoint(model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(model_dir, "model.safetensors"))


def layerscales(model):
    """{vLLM name: values} of every ls1/ls2 parameter."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith((".ls1", ".ls2"))}


def hf_name(vllm_name):
    # vision_model.model.encoder.layers.{i}.lsN -> vision_model.radio_model.model.blocks.{i}.lsN
    return vllm_name.replace("vision_model.model.encoder.layers.", "vision_model.radio_model.model.blocks.")


def gap_to_checkpoint(model, weights):
    return max(float((v - weights[hf_name(n)]).abs().max()) for n, v in layerscales(model).items())


def gap_to_factor(model):
    return max(float((v - INITIALIZER_FACTOR).abs().max()) for v in layerscales(model).values())


def pixels():
    import torch

    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def explicit_auto(model_dir, init_distributed):
    """Real weights: are the checkpoint's LayerScales used? Output vs the model with them written in by hand."""
    import torch

    weights = checkpoint(model_dir)
    model = build(model_dir, "auto", init_distributed)
    x = pixels()
    with torch.no_grad():
        loaded = model(pixel_values=x)
        gap = gap_to_checkpoint(model, weights)
        at_factor = gap_to_factor(model)
        for name, param in model.named_parameters():
            if name.endswith((".ls1", ".ls2")):
                param.copy_(weights[hf_name(name)])
        reference = model(pixel_values=x)
    return {
        "layerscales": len(layerscales(model)),
        "ls_gap_to_checkpoint": gap,
        "ls_gap_to_initializer_factor": at_factor,
        "output_gap_to_reference": float((loaded - reference).abs().max()),
        "output_scale": float(reference.abs().max()),
    }


def refit_case(model_dir, refit_dir, init_distributed, buckets=False):
    """Dummy load, then a refit through the model's own load_weights from `refit_dir`'s weights (optionally a second
    call with a bucket of two non-LayerScale tensors), then one generation step (the forward)."""
    import torch
    from log_records import Records

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    weights = checkpoint(refit_dir)
    model = build(model_dir, "dummy", init_distributed)
    dummy = layerscales(model)
    with torch.no_grad():
        model.load_weights(iter(weights.items()))
        if buckets:
            bucket = [(n, t) for n, t in weights.items() if not n.endswith((".ls1", ".ls2"))][:2]
            model.load_weights(iter(bucket))
        model(pixel_values=pixels())  # a generation step: the refit guard checks here
    logging.getLogger("nrl_shim").removeHandler(records)
    now = layerscales(model)
    result = {
        "ls_still_dummy": sorted(n for n in now if torch.equal(now[n], dummy[n])),
        "ls_gap_to_initializer_factor": gap_to_factor(model),
        "guard_warnings": [m for level, m in records.messages if level in ("WARNING", "ERROR")],
    }
    if any(n.endswith((".ls1", ".ls2")) for n in weights):
        result["ls_gap_to_checkpoint"] = gap_to_checkpoint(model, weights)
    return result


def main(argv):
    if argv[0] == "--write":
        print(json.dumps(write(argv[1])))
        return
    directory = argv[0]
    if not os.path.isfile(os.path.join(directory, "folded", "config.json")):
        write(directory)
    platform, init_distributed = _platform()
    import vllm

    shim = sys.modules.get("nrl_shim")  # not imported here: `import nrl_shim` would activate it
    active = shim is not None and shim.activation.is_active()
    explicit, folded = os.path.join(directory, "explicit"), os.path.join(directory, "folded")
    result = {"vllm": vllm.__version__, "platform": platform, "shim_active": active}
    result["explicit_auto"] = explicit_auto(explicit, init_distributed)
    if active:  # see the docstring: a load_weights refit on the CPU build needs vllm-cpu-refit
        result["folded_dummy_refit"] = refit_case(folded, folded, init_distributed)
        result["explicit_dummy_refit_buckets"] = refit_case(explicit, explicit, init_distributed, buckets=True)
        result["patched"] = shim.activation.patched()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
