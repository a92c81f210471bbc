"""The step lifecycle of every family: outputs, locks, state, progress, stops, record."""
