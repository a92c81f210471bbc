"""The SSVAE family: Kingma et al.'s M2 semi-supervised VAE over a grid of label fractions,
label-corruption rates, alphas and seeds, with a labelled-only classifier as baseline."""
