"""The terminal: the `loadwatch status` screen and the `analyze` report as text."""
