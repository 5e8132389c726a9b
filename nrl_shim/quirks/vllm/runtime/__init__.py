"""vLLM fixes of a running engine's plumbing (timeouts, ports, message queues, the OpenAI server's tools)."""
