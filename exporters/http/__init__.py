"""The HTTP side: /metrics, /status, /healthz, /readyz, served from a process of its own."""
