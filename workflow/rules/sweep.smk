"""The sweep family: not built yet."""
