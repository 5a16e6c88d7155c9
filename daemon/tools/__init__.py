"""The offline commands: analyze, preflight, patch-model, demo."""
