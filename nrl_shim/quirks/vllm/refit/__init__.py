"""vLLM fixes that keep rollouts on the weights just loaded (refits): the guard, layer re-processing, prefix caches, LoRA."""
