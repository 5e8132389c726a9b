"""vLLM fixes that correct an engine's configuration before it starts (load format, V1, eager recipes, the dist name)."""
