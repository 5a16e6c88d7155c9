#!/usr/bin/env bash
# Debian packages the tests use for real: prometheus (server + promtool), alertmanager (the
# inhibit rules), mtail, systemd (systemd-analyze, journalctl), systemd-journal-remote (it writes
# the journal files the journald tests read).
# Installs what is missing when run as root; otherwise says what is missing and fails.
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v mtail >/dev/null 2>&1 || need+=(mtail)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v logrotate >/dev/null 2>&1 || need+=(logrotate)
[ -x /usr/lib/systemd/systemd-journal-remote ] || [ -x /lib/systemd/systemd-journal-remote ] || need+=(systemd-journal-remote)
[ ${#need[@]} -eq 0 ] && exit 0
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]} (install them as root: apt-get install ${need[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
