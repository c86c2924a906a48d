"""Load balancing without an auxiliary loss: a selection-only bias per expert, one balancer object per rule.

Experts are chosen on ``logits + bias_E``; the bias gets no gradient. A balancer ``observe``s the load of each
training forward and, between optimizer steps, ``update``s the bias from the load counted since the last
update, summed over all data-parallel ranks (it all-reduces when ``torch.distributed`` is initialised).

* ``sign`` (DeepSeek-V3): ``bias_e += rate * sign(mean load - load_e)``.
* ``quantile`` (Marin): ``bias -= beta``, ``beta_e`` the (1 - k/E) quantile over tokens of the margin between
  expert e's score and the token's (k+1)-th largest, read from a histogram so that ranks can sum it. Margins
  are measured on the *biased* scores: from a zero bias that is the published rule, and repeated it converges
  (beta_e = 0 means expert e is in the top k of exactly k/E of the tokens). Margins of the unbiased logits
  would give the same one-shot bias each time; on tests/test_moe.py's skewed router that leaves a 1.9x
  max/mean load, the repeated rule 1.1x.
* ``none``: counts the load (for statistics) and never moves the bias.
"""

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["BALANCERS", "Balancer", "QuantileBalancer", "SignBalancer", "histogram_quantile", "make_balancer",
           "margin_histogram"]


def margin_histogram(score_TE: Tensor, k: int, bins: int, limit: float) -> Tensor:
    """Histogram [E,B] (int64) of each score's margin over its token's (k+1)-th largest score, B bins over
    [-limit, limit] (outliers in the end bins). Summing histograms over ranks gives the global one."""
    T, E = score_TE.shape
    margins_TE = score_TE - score_TE.topk(k + 1, dim=-1).values[:, k:]
    bin_TE = ((margins_TE + limit) * (bins / (2 * limit))).floor().long().clamp(0, bins - 1)
    flat_N = (bin_TE + torch.arange(E, device=score_TE.device) * bins).reshape(-1)
    hist = torch.zeros(E * bins, dtype=torch.long, device=score_TE.device)
    return hist.scatter_add_(0, flat_N, torch.ones_like(flat_N)).view(E, bins)  # static shape, unlike bincount


def histogram_quantile(hist_EB: Tensor, q: float, limit: float) -> Tensor:
    """The q-quantile [E] (fp32) of each expert's histogram over [-limit, limit], linear within a bin."""
    counts_EB = hist_EB.double()
    B = counts_EB.shape[1]
    cum_EB = counts_EB.cumsum(-1)
    target_E1 = q * cum_EB[:, -1:]
    idx_E1 = (cum_EB < target_E1).sum(-1, keepdim=True).clamp(max=B - 1)  # first bin reaching the target
    in_bin_E1 = counts_EB.gather(1, idx_E1)
    frac_E1 = ((target_E1 - (cum_EB.gather(1, idx_E1) - in_bin_E1)) / in_bin_E1.clamp(min=1)).clamp(0, 1)
    return (-limit + (idx_E1 + frac_E1) * (2 * limit / B)).squeeze(1).float()


def _all_reduce(t: Tensor) -> Tensor:
    """The sum of `t` over all ranks (a copy; `t` itself is left alone)."""
    t = t.clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


class Balancer(nn.Module):
    """The ``none`` rule, and the base of the others: counts the token copies routed to each expert.

    The counts are buffers (they follow the module's device) that are not checkpointed: every update resets
    them, and a checkpoint is taken after an update.
    """

    def __init__(self, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.register_buffer("load_E", torch.zeros(num_experts, dtype=torch.long), persistent=False)

    @torch.no_grad()
    def observe(self, score_TE: Tensor, counts_E: Tensor) -> None:
        """Adds one forward's load: the biased selection scores [T,E] and the copies sent to each expert."""
        self.load_E += counts_E

    @torch.no_grad()
    def update(self, bias_E: Tensor) -> None:
        """Moves `bias_E` in place from the global load counted since the last call, then resets the count."""
        self._step(bias_E, _all_reduce(self.load_E))
        self.load_E.zero_()

    def _step(self, bias_E: Tensor, load_E: Tensor) -> None:
        pass


class SignBalancer(Balancer):
    """DeepSeek-V3's rule: overloaded experts down, underloaded ones up, by a fixed ``rate``."""

    def __init__(self, num_experts: int, top_k: int, rate: float):
        super().__init__(num_experts, top_k)
        self.rate = rate

    def _step(self, bias_E: Tensor, load_E: Tensor) -> None:
        if load_E.sum() > 0:
            bias_E += self.rate * torch.sign(load_E.float().mean() - load_E.float())


class QuantileBalancer(Balancer):
    """Marin's rule: each expert's bias moves so that it wins about k/E of the tokens (module docstring)."""

    def __init__(self, num_experts: int, top_k: int, bins: int, limit: float):
        super().__init__(num_experts, top_k)
        self.bins, self.limit = bins, limit
        self.register_buffer("margin_hist_EB", torch.zeros(num_experts, bins, dtype=torch.long), persistent=False)

    @torch.no_grad()
    def observe(self, score_TE: Tensor, counts_E: Tensor) -> None:
        super().observe(score_TE, counts_E)
        self.margin_hist_EB += margin_histogram(score_TE, self.top_k, self.bins, self.limit)

    @torch.no_grad()
    def update(self, bias_E: Tensor) -> None:
        hist_EB = _all_reduce(self.margin_hist_EB)
        if hist_EB.sum() > 0:
            bias_E -= histogram_quantile(hist_EB, 1 - self.top_k / bias_E.numel(), self.limit)
        self.margin_hist_EB.zero_()
        super().update(bias_E)


BALANCERS = {"none": Balancer, "sign": SignBalancer, "quantile": QuantileBalancer}


def make_balancer(rule: str, num_experts: int, top_k: int, *, rate: float, bins: int, limit: float) -> Balancer:
    """The balancer of `rule` ("none" | "sign" | "quantile"), with the knobs that rule takes."""
    if rule == "sign":
        return SignBalancer(num_experts, top_k, rate)
    if rule == "quantile":
        return QuantileBalancer(num_experts, top_k, bins, limit)
    if rule == "none":
        return Balancer(num_experts, top_k)
    raise ValueError(f"bias_update must be one of {', '.join(BALANCERS)}, got {rule!r}")
