"""vLLM fixes for one model family's file (RADIO, EAGLE-3)."""
