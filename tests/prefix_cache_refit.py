"""Refit functions the prefix-cache tests send into vLLM's workers (importable there: vLLM pickles a function by
reference, so it must live in a module on the workers' PYTHONPATH, not in the child's __main__)."""


def refit_model(model, path):
    """What an RL framework's refit does in the worker: the model's own load_weights with the trainer's tensors (here
    read from a checkpoint). For LLM.apply_model (it passes the model)."""
    from tiny_models import state_dict_items

    model.load_weights(state_dict_items(path))


def refit_worker(worker, path):
    """The same through collective_rpc (it passes the worker), as verl's and NeMo RL's worker extensions do."""
    refit_model(worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model, path)
