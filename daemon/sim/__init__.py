"""Simulated vLLM and GPUs, for the demo and the tests."""
