"""Sources: each owns its I/O and hands value types to the loop (log, GPUs, /proc, model dir, /health)."""
