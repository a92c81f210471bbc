"""M2's per-run training loss written out plainly, as an independent reference for gpu-check.

Kingma et al. (2014), eq. 6-9, one run at a time, no stacking, no shared x W_x, the 10 labels
of the unlabelled bound enumerated in a Python loop, the inputs of q(z|x,y) and p(x|y,z)
concatenated as the paper writes them. It reads the weights of one run of a StackedM2 and the
noise the trainer draws, so its loss must equal the trainer's to float rounding; a wrong term in
the trainer (e.g. the entropy of q(y|x) left out of -U(x)) shows up as a deviation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpuflow.ssvae.model import N_CLASSES, StackedM2


def _layer(layer: torch.nn.Module, run: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    bias = None if layer.bias is None else layer.bias[run, 0]
    return layer.weight[run], bias


def _neg_elbo(
    model: StackedM2, run: int, x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor
) -> torch.Tensor:
    """-L(x, y) = -log p(x|y,z) + KL(q(z|x,y) || N(0, I)) - log p(y), one z sample per row."""
    w_ex, b_ex = _layer(model.enc_x, run)
    w_ey, _ = _layer(model.enc_y, run)
    w_mu, b_mu = _layer(model.enc_out, run)
    w_dz, b_dz = _layer(model.dec_z, run)
    w_dy, _ = _layer(model.dec_y, run)
    w_px, b_px = _layer(model.dec_out, run)
    h = F.softplus(torch.cat([x, y], dim=1) @ torch.cat([w_ex, w_ey]) + b_ex)
    mu, logvar = (h @ w_mu + b_mu).chunk(2, dim=1)
    z = mu + torch.exp(0.5 * logvar) * eps
    logits = F.softplus(torch.cat([z, y], dim=1) @ torch.cat([w_dz, w_dy]) + b_dz) @ w_px + b_px
    log_px = (x * F.logsigmoid(logits) + (1 - x) * F.logsigmoid(-logits)).sum(1)
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(1)
    log_py = -math.log(N_CLASSES)
    return -(log_px - kl + log_py)


def _classify(model: StackedM2, run: int, x: torch.Tensor) -> torch.Tensor:
    w_1, b_1 = _layer(model.classifier.hidden, run)
    w_2, b_2 = _layer(model.classifier.out, run)
    return F.softplus(x @ w_1 + b_1) @ w_2 + b_2


@torch.no_grad()
def m2_loss(
    model: StackedM2,
    run: int,
    batch: dict[str, torch.Tensor],
    eps_l: torch.Tensor,
    eps_u: torch.Tensor,
) -> float:
    """mean(w (-L(x,y)) + alpha CE) over the labelled batch + mean(-U(x)) over the unlabelled
    one, for run `run` (w: its labelled bound's weight);
    -U(x) = sum_y q(y|x) (-L(x,y)) - H(q(y|x))."""
    x_l, y_l, x_u = batch["x_l"][run], batch["y_l"][run], batch["x_u"][run]
    alpha, weight = float(model.alpha[run]), float(model.bound_weight[run])
    labelled = _neg_elbo(model, run, x_l, F.one_hot(y_l, N_CLASSES).to(x_l.dtype), eps_l[run])
    ce = F.cross_entropy(_classify(model, run, x_l), y_l, reduction="none")
    labelled = weight * labelled + alpha * ce
    q = torch.softmax(_classify(model, run, x_u), dim=1)
    expected = torch.zeros(len(x_u), dtype=x_u.dtype, device=x_u.device)
    for label in range(N_CLASSES):
        onehot = torch.zeros(len(x_u), N_CLASSES, dtype=x_u.dtype, device=x_u.device)
        onehot[:, label] = 1
        expected += q[:, label] * _neg_elbo(model, run, x_u, onehot, eps_u[run, :, label])
    entropy = -(q * torch.log(q)).sum(1)
    return float(labelled.mean() + (expected - entropy).mean())
