"""The ssvae family: not built yet."""
