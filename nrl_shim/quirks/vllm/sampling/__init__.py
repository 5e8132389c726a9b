"""vLLM fixes that keep rollouts sampled as the trainer assumes (sampling defaults, logprobs, tool grammars, seeds)."""
