"""/proc sources: the vLLM process tree and the bytes it has read."""
