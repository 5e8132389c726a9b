"""vllm-radio-layerscale under NeMo RL HEAD's rewrite of radio.py (`_patch_vllm_radio_layerscale_loader`): its two
code snippets, read from NeMo RL's patches.py (given), applied to this venv's vLLM radio.py source in memory (a new
module; no file is written), then the shim's patch() on that module. Prints one JSON line: whether NeMo RL's snippet
matched this vLLM, the shim's decision on vLLM's own and on the rewritten loader, and what the shim logged.

    python vllm_radio_nemo_rl_rewrite.py PATH/TO/nemo_rl/models/generation/vllm/patches.py
"""

import ast
import json
import logging
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def snippets(patches_py):
    tree = ast.parse(open(patches_py).read())
    function = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "_patch_vllm_radio_layerscale_loader"
    )
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in function.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and "snippet" in node.targets[0].id
    }


def main(patches_py):
    import vllm.model_executor.models.radio as radio
    from log_records import Records

    from nrl_shim.quirks.vllm.models import radio_layerscale as quirk

    found = snippets(patches_py)
    text = open(radio.__file__).read()
    result = {
        "snippet_matches": found["old_snippet"] in text,
        "vllm_own_skips": quirk.skips_layerscale(radio.RadioModel.load_weights),
    }
    if result["snippet_matches"]:
        rewritten = types.ModuleType(radio.__name__ + "_nemo_rl")
        exec(
            compile(text.replace(found["old_snippet"], found["new_snippet"], 1), "radio_nemo_rl.py", "exec"),
            rewritten.__dict__,
        )
        records = Records()
        logging.getLogger("nrl_shim").addHandler(records)
        result["rewritten_skips"] = quirk.skips_layerscale(rewritten.RadioModel.load_weights)
        quirk.patch(rewritten, None)
        result["wrapped"] = hasattr(rewritten.RadioModel.load_weights, "__wrapped__")
        result["log"] = records.messages
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
