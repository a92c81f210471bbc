"""M2 (Kingma et al. 2014) and its classifier, stacked: R independent runs in one module."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

N_CLASSES = 10
N_PIXELS = 28 * 28


class StackedLinear(nn.Module):
    """R independent linear layers: x [R, N, n_in] -> [R, N, n_out]."""

    def __init__(self, n_runs: int, n_in: int, n_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_runs, n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_runs, 1, n_out)) if bias else None

    def reset(self, generators: list[torch.Generator], fan_in: int) -> None:
        """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) per run from that run's generator."""
        bound = 1.0 / math.sqrt(fan_in)
        with torch.no_grad():
            for r, generator in enumerate(generators):
                for param in (self.weight, self.bias):
                    if param is not None:
                        shape = param.shape[1:]
                        draw = torch.rand(shape, generator=generator, dtype=param.dtype)
                        param[r].copy_((draw * 2 - 1) * bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.bmm(x, self.weight)
        return torch.baddbmm(self.bias, x, self.weight)


class StackedClassifier(nn.Module):
    """q(y|x): one softplus hidden layer, logits over 10 classes."""

    def __init__(self, n_runs: int, hidden: int):
        super().__init__()
        self.hidden = StackedLinear(n_runs, N_PIXELS, hidden)
        self.out = StackedLinear(n_runs, hidden, N_CLASSES)

    def reset(self, generators: list[torch.Generator]) -> None:
        self.hidden.reset(generators, N_PIXELS)
        self.out.reset(generators, self.hidden.weight.shape[2])

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.softplus(self.hidden(x)))

    def forward(self, x_l: torch.Tensor, y_l: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-example cross-entropy of the labelled batch (the baseline's loss)."""
        ce = cross_entropy(self.logits(x_l), y_l)
        return {"labelled": ce, "ce": ce}


def class_rows(weight: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """onehot(y) W_y without the matmul, for each example's label or all 10 classes."""
    if labels is None:
        return weight[:, None, :, :]
    index = labels[:, :, None].expand(-1, -1, weight.shape[2])
    return torch.gather(weight, 1, index)[:, :, None, :]


class BernoulliNLL(torch.autograd.Function):
    """-log p(x | logits) of grey levels x, summed over pixels: softplus(l) - x l."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(logits, x)
        dot = torch.matmul(logits, x[:, :, :, None]).squeeze(-1)
        return F.softplus(logits).sum(-1) - dot

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        logits, x = ctx.saved_tensors
        grad_logits = grad_x = None
        if ctx.needs_input_grad[0]:
            grad_logits = torch.sigmoid(logits).sub_(x[:, :, None, :]).mul_(grad[..., None])
        if ctx.needs_input_grad[1]:
            grad_x = -(grad[..., None] * logits).sum(2)
        return grad_logits, grad_x


def bernoulli_nll(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """See BernoulliNLL."""
    return BernoulliNLL.apply(logits, x)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy, logits [R, B, K] and labels [R, B] -> [R, B]."""
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)


class StackedM2(nn.Module):
    """M2 with Bernoulli p(x|y,z), Gaussian q(z|x,y), categorical q(y|x); R runs stacked."""

    def __init__(
        self,
        n_runs: int,
        hidden: int,
        latent: int,
        alpha: torch.Tensor,
        bound_weight: torch.Tensor | None = None,
    ):
        super().__init__()
        self.latent = latent
        self.classifier = StackedClassifier(n_runs, hidden)
        self.enc_x = StackedLinear(n_runs, N_PIXELS, hidden)
        self.enc_y = StackedLinear(n_runs, N_CLASSES, hidden, bias=False)
        self.enc_out = StackedLinear(n_runs, hidden, 2 * latent)
        self.dec_z = StackedLinear(n_runs, latent, hidden)
        self.dec_y = StackedLinear(n_runs, N_CLASSES, hidden, bias=False)
        self.dec_out = StackedLinear(n_runs, hidden, N_PIXELS)
        self.register_buffer("alpha", alpha.reshape(n_runs, 1).clone())
        weight = torch.ones(n_runs) if bound_weight is None else bound_weight
        self.register_buffer("bound_weight", weight.reshape(n_runs, 1).to(alpha.dtype).clone())
        self.register_buffer("log_prior_y", torch.tensor(math.log(N_CLASSES)))

    def reset(self, generators: list[torch.Generator]) -> None:
        """Initialise every run from its own generator, in a fixed layer order."""
        hidden = self.enc_x.weight.shape[2]
        self.classifier.reset(generators)
        self.enc_x.reset(generators, N_PIXELS + N_CLASSES)
        self.enc_y.reset(generators, N_PIXELS + N_CLASSES)
        self.enc_out.reset(generators, hidden)
        self.dec_z.reset(generators, self.latent + N_CLASSES)
        self.dec_y.reset(generators, self.latent + N_CLASSES)
        self.dec_out.reset(generators, hidden)

    def neg_elbo(
        self, x: torch.Tensor, eps: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """-log p(x|y,z) and KL(q(z|x,y)||p(z)) for each label (`labels` None: all 10)."""
        runs, batch, _ = x.shape
        k = eps.shape[2]
        h = F.softplus(self.enc_x(x)[:, :, None, :] + class_rows(self.enc_y.weight, labels))
        stats = self.enc_out(h.view(runs, batch * k, -1))
        mu, logvar = stats.chunk(2, dim=-1)
        z = mu + torch.exp(0.5 * logvar) * eps.reshape(runs, batch * k, self.latent)
        decoded = self.dec_z(z).view(runs, batch, k, -1) + class_rows(self.dec_y.weight, labels)
        logits = self.dec_out(F.softplus(decoded).view(runs, batch * k, -1))
        recon = bernoulli_nll(logits.view(runs, batch, k, -1), x)
        kl = 0.5 * (mu.square() + logvar.exp() - 1.0 - logvar).sum(-1).view(runs, batch, k)
        return {"recon": recon, "kl": kl, "neg_elbo": recon + kl + self.log_prior_y}

    def forward(
        self,
        x_l: torch.Tensor,
        y_l: torch.Tensor,
        x_u: torch.Tensor,
        eps_l: torch.Tensor,
        eps_u: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """Per-example losses: labelled w (-L(x,y)) + alpha CE, unlabelled -U(x); all [R, B]."""
        labelled = self.labelled_terms(x_l, y_l, eps_l)
        unlabelled = self.unlabelled_terms(x_u, eps_u)
        return {
            "labelled": self.bound_weight * labelled["neg_elbo"] + self.alpha * labelled["ce"],
            "unlabelled": unlabelled["neg_bound"],
            "ce": labelled["ce"],
        }

    def labelled_terms(
        self, x: torch.Tensor, y: torch.Tensor, eps: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """-L(x, y) and its parts, and the classifier's CE, for labelled examples."""
        terms = self.neg_elbo(x, eps[:, :, None, :], y)
        out = {key: value.squeeze(2) for key, value in terms.items()}
        out["ce"] = cross_entropy(self.classifier.logits(x), y)
        return out

    def unlabelled_terms(self, x: torch.Tensor, eps: torch.Tensor) -> dict[str, torch.Tensor]:
        """-U(x) = sum_y q(y|x) (-L(x, y) + log q(y|x)), enumerating all 10 classes."""
        log_q = torch.log_softmax(self.classifier.logits(x), dim=-1)
        terms = self.neg_elbo(x, eps)
        neg_bound = (log_q.exp() * (terms["neg_elbo"] + log_q)).sum(-1)
        return {"neg_bound": neg_bound, "log_q": log_q}
