"""Views of the load state: Prometheus, JSON status, event log, terminal screen, reports."""
