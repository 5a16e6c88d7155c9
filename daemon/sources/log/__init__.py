"""The log source: follow one path across rotation and restarts, and say what is already out."""
