"""The load state: a fold over everything the daemon observes, and the snapshots exporters read."""
