"""Supervise vLLM: start it, capture its log, restart by policy, stop it with nothing left behind."""
