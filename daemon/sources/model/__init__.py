"""The model directory: what a checkpoint declares, read once."""
