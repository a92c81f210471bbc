"""The SSVAE family: Kingma et al.'s M2 over a grid, with a labelled-only baseline."""
