"""The scaling family: not built yet."""
