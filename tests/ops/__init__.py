"""Operations: systemd units, Prometheus rules, Grafana dashboard, runbook."""
