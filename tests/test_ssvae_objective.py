"""The stacked M2 objective equals Kingma et al.'s (2014) equations written out plainly.

The reference below reads each run's weights out of the stacked model and evaluates, for one
run at a time and one class at a time,

    L(x, y) = E_q(z|x,y)[log p(x|y,z)] + log p(y) - KL(q(z|x,y) || p(z))        (eq. 6)
    U(x)    = sum_y q(y|x) L(x, y) + H(q(y|x))                                  (eq. 7)
    labelled loss = -L(x, y) + alpha * (-log q(y|x))                            (eq. 9)

with the reparameterised z = mu + sigma * eps, a Bernoulli p(x|y,z) with grey levels as
targets, p(y) uniform over 10 classes and p(z) = N(0, I).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpuflow.ssvae.model import N_CLASSES, N_PIXELS, StackedM2, bernoulli_nll

RUNS, BATCH, HIDDEN, LATENT = 3, 5, 24, 4
ALPHAS = [0.5, 10.0, 400.0]


def layer(module: torch.nn.Module, run: int, x: torch.Tensor) -> torch.Tensor:
    """x W + b with run `run`'s slice of a stacked layer."""
    out = x @ module.weight[run]
    return out + module.bias[run, 0] if module.bias is not None else out


def log_q_y(model: StackedM2, run: int, x: torch.Tensor) -> torch.Tensor:
    """log q(y|x) of every class, [B, 10]."""
    hidden = F.softplus(layer(model.classifier.hidden, run, x))
    return torch.log_softmax(layer(model.classifier.out, run, hidden), dim=-1)


def elbo(model: StackedM2, run: int, x: torch.Tensor, y: int, eps: torch.Tensor) -> torch.Tensor:
    """L(x, y) for a batch of examples all given class y, [B]."""
    onehot = F.one_hot(torch.full((len(x),), y), N_CLASSES).to(x.dtype)
    h = F.softplus(layer(model.enc_x, run, x) + layer(model.enc_y, run, onehot))
    mu, logvar = layer(model.enc_out, run, h).chunk(2, dim=-1)
    z = mu + torch.exp(0.5 * logvar) * eps
    h_dec = F.softplus(layer(model.dec_z, run, z) + layer(model.dec_y, run, onehot))
    logits = layer(model.dec_out, run, h_dec)
    log_px = (x * F.logsigmoid(logits) + (1 - x) * F.logsigmoid(-logits)).sum(-1)
    log_py = -math.log(N_CLASSES)
    kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(-1)
    return log_px + log_py - kl


def reference_labelled(model, x, y, eps, alphas, weights=(1.0,) * RUNS) -> torch.Tensor:
    """w (-L(x, y)) + alpha * CE per run and example, [R, B]: one run, one label at a time."""
    rows = []
    for run in range(RUNS):
        losses = []
        for i in range(BATCH):
            label = int(y[run, i])
            neg_l = -elbo(model, run, x[run, i : i + 1], label, eps[run, i : i + 1])
            ce = -log_q_y(model, run, x[run, i : i + 1])[0, label]
            losses.append(weights[run] * neg_l[0] + alphas[run] * ce)
        rows.append(torch.stack(losses))
    return torch.stack(rows)


def reference_unlabelled(model, x, eps) -> torch.Tensor:
    """-U(x) per run and example, [R, B], looping over the 10 classes."""
    rows = []
    for run in range(RUNS):
        log_q = log_q_y(model, run, x[run])
        q = log_q.exp()
        expected_l = sum(q[:, y] * elbo(model, run, x[run], y, eps[run, :, y]) for y in range(10))
        entropy = -(q * log_q).sum(-1)
        rows.append(-(expected_l + entropy))
    return torch.stack(rows)


def fixed_model_and_inputs(weights=None) -> tuple[StackedM2, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    bound_weight = None if weights is None else torch.tensor(weights)
    model = StackedM2(RUNS, HIDDEN, LATENT, torch.tensor(ALPHAS), bound_weight).double()
    model.reset([torch.Generator().manual_seed(run) for run in range(RUNS)])
    with torch.no_grad():  # no parameter may be left at a value that hides a term
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    inputs = {
        "x_l": torch.rand(RUNS, BATCH, N_PIXELS, dtype=torch.float64),
        "y_l": torch.randint(0, N_CLASSES, (RUNS, BATCH)),
        "x_u": torch.rand(RUNS, BATCH, N_PIXELS, dtype=torch.float64),
        "eps_l": torch.randn(RUNS, BATCH, LATENT, dtype=torch.float64),
        "eps_u": torch.randn(RUNS, BATCH, N_CLASSES, LATENT, dtype=torch.float64),
    }
    return model, inputs


def assert_same_loss_and_gradients(model, stacked: torch.Tensor, plain: torch.Tensor) -> None:
    torch.testing.assert_close(stacked, plain, rtol=1e-5, atol=1e-5)
    params = list(model.parameters())
    ours = torch.autograd.grad(stacked.sum(), params, allow_unused=True, retain_graph=True)
    theirs = torch.autograd.grad(plain.sum(), params, allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), ours, theirs, strict=True):
        if a is None or b is None:
            assert a is None and b is None, name
            continue
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_labelled_loss_and_its_gradients_equal_the_plain_m2_equations():
    model, inputs = fixed_model_and_inputs()
    stacked = model(**inputs)["labelled"]
    plain = reference_labelled(model, inputs["x_l"], inputs["y_l"], inputs["eps_l"], ALPHAS)
    assert_same_loss_and_gradients(model, stacked, plain)


def test_each_run_weighs_its_labelled_bound_by_its_own_weight_and_not_the_cross_entropy():
    weights = tuple(0.002 * (run + 1) for run in range(RUNS))
    model, inputs = fixed_model_and_inputs(weights)
    stacked = model(**inputs)["labelled"]
    plain = reference_labelled(
        model, inputs["x_l"], inputs["y_l"], inputs["eps_l"], ALPHAS, weights
    )
    assert_same_loss_and_gradients(model, stacked, plain)


def test_unlabelled_loss_and_its_gradients_equal_the_plain_m2_equations():
    model, inputs = fixed_model_and_inputs()
    stacked = model(**inputs)["unlabelled"]
    plain = reference_unlabelled(model, inputs["x_u"], inputs["eps_u"])
    assert_same_loss_and_gradients(model, stacked, plain)


def test_the_bernoulli_nll_and_its_gradients_in_both_arguments_are_the_textbook_ones():
    """softplus(l) - x l summed over pixels, x broadcast over the labels; gradcheck in float64."""
    generator = torch.Generator().manual_seed(0)
    logits = (
        4 * torch.randn(2, 3, 4, 6, generator=generator, dtype=torch.float64)
    ).requires_grad_()
    x = torch.rand(2, 3, 6, generator=generator, dtype=torch.float64).requires_grad_()
    textbook = -(x[:, :, None] * F.logsigmoid(logits) + (1 - x[:, :, None]) * F.logsigmoid(-logits))
    torch.testing.assert_close(bernoulli_nll(logits, x), textbook.sum(-1))
    assert torch.autograd.gradcheck(bernoulli_nll, (logits, x))
