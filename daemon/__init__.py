"""The loadwatch process: sources, state, forecasts, supervisor and command line."""
