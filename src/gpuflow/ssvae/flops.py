"""Matmul FLOPs of M2 and its classifier: the work a device's FLOP rate is measured against."""

from __future__ import annotations

PIXELS, CLASSES = 784, 10


def matmul_shapes(
    hidden: int, latent: int, runs: int, unlabelled: int = 100, labelled: int = 100
) -> list[tuple[int, int, int, int]]:
    """(batch, rows, inner, cols) of every forward matmul of one stacked M2 step."""
    shapes = []
    for rows, k in ((unlabelled, CLASSES), (labelled, 1)):
        shapes += [
            (runs, rows, PIXELS, hidden),
            (runs, rows, hidden, CLASSES),  # classifier
            (runs, rows, PIXELS, hidden),  # x W_x, once per example
            (runs, rows * k, hidden, 2 * latent),  # mu/logvar
            (runs, rows * k, latent, hidden),  # decoder in
            (runs, rows * k, hidden, PIXELS),
            (runs, rows * k, PIXELS, 1),  # decoder out, x . logits
        ]
    return shapes


def forward_flops(shapes: list[tuple[int, int, int, int]]) -> float:
    """FLOPs of the forward matmuls `shapes` (2 per multiply-add)."""
    return float(sum(2 * b * m * k * n for b, m, k, n in shapes))


def train_flops_per_example(
    hidden: int, latent: int, unlabelled: int = 100, labelled: int = 100
) -> float:
    """Training matmul FLOPs per example (labelled or unlabelled): 3 x the forward matmuls."""
    shapes = matmul_shapes(hidden, latent, 1, unlabelled, labelled)
    return 3 * forward_flops(shapes) / (unlabelled + labelled)


def classifier_flops(hidden: int) -> float:
    """Forward matmul FLOPs of q(y|x) (the baseline's whole model) for one example."""
    return 2.0 * (PIXELS * hidden + hidden * CLASSES)


def step_flops(model: str, hidden: int, latent: int, unlabelled: int, labelled: int) -> float:
    """Training matmul FLOPs of one step of one run of `model` ('m2' or the baseline)."""
    if model == "m2":
        return train_flops_per_example(hidden, latent, unlabelled, labelled) * (
            unlabelled + labelled
        )
    return 3 * classifier_flops(hidden) * labelled


def m2_parameters(hidden: int, latent: int) -> int:
    """Parameters of one M2 run: classifier, encoder (x W_x, class rows, mu/logvar), decoder."""
    encoder = PIXELS * hidden + CLASSES * hidden + hidden + hidden * 2 * latent + 2 * latent
    decoder = latent * hidden + CLASSES * hidden + hidden + hidden * PIXELS + PIXELS
    return classifier_parameters(hidden) + encoder + decoder


def classifier_parameters(hidden: int) -> int:
    """Parameters of one baseline run (q(y|x) alone)."""
    return PIXELS * hidden + hidden + hidden * CLASSES + CLASSES
