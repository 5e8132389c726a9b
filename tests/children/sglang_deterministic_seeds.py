"""The seeds SGLang's batch builder hands its sampler (`SamplingBatchInfo.from_schedule_batch(batch, vocab_size)`), for
SGLang's own `Req` objects built as its scheduler builds them, under SGLang's own settings published in this process
as a scheduler publishes them (`ServerArgs` resolved, then `publish(..., role="scheduler")` on the 0.5.2x line,
`set_global_server_args_for_scheduler` before): once with deterministic inference off, once on. The shim acts here as
in a scheduler (NRL_SHIM set by the test, the CPU harness on PYTHONPATH).

Deterministic inference needs GPU kernels (triton's seeded hash, batch-invariant matmuls): it does not start on a CPU,
and SGLang refuses it with a CPU attention backend. So the CPU backend is registered as a deterministic one through
SGLang's own plugin function (`add_deterministic_attention_backend_choices`), and nothing is sampled: the batch
builder's seeds are the sampler's whole input besides the logits. The batch is a namespace with the two fields the
builder reads (`reqs`, `device`), as a ScheduleBatch holds them. argv[1]: the checkpoint (ServerArgs reads its config). Prints one JSON line:
per setting, each request's `sampling_params.sampling_seed` and the builder's seed tensor (None where it builds none).
"""

import json
import sys

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, add_deterministic_attention_backend_choices


class Batch:
    """The two fields of a ScheduleBatch the builder reads (its penalizers hold a weak reference to it)."""

    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


GROUP = 8  # a GRPO group: 8 requests of one prompt at temperature 1.0, no seed
OWN_SEED = 7  # a request with its own seed


def publish(model_path, deterministic):
    server_args = ServerArgs(
        model_path=model_path,
        device="cpu",
        attention_backend="torch_native",
        enable_deterministic_inference=deterministic,
        disable_cuda_graph=True,
        dtype="float32",
    )
    try:
        from sglang.srt.runtime_context import publish as publish_settings  # the 0.5.2x line
    except ImportError:  # up to 0.5.12.post1
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(server_args)
    else:
        publish_settings(server_args, role="scheduler")


def requests():
    reqs = [Req(f"group-{i}", "", [3, 4, 5], SamplingParams(temperature=1.0, max_new_tokens=8)) for i in range(GROUP)]
    own = SamplingParams(temperature=1.0, max_new_tokens=8, sampling_seed=OWN_SEED)
    return [*reqs, Req("own-seed", "", [3, 4, 5], own)]


def main():
    add_deterministic_attention_backend_choices(["torch_native"])  # SGLang's hook for a backend's plugin
    out = {}
    for name, deterministic in (("off", False), ("on", True)):
        publish(sys.argv[1], deterministic)
        reqs = requests()
        info = SamplingBatchInfo.from_schedule_batch(Batch(reqs), vocab_size=512)
        seeds = info.sampling_seed
        out[name] = {
            "request_seeds": [req.sampling_params.sampling_seed for req in reqs],
            "batch_seeds": None if seeds is None else [int(seed) for seed in seeds.tolist()],
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
