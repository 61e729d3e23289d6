"""Sampling settings and the one function that turns logits into probabilities.

Target and drafters both go through :func:`logits_to_probs`, so p and q are always processed the
same way (temperature, then top-k, then top-p). Applying a filter to one side only silently
changes the output distribution; notebook 01 shows it failing a statistical test.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature=0.0 means greedy; top_k=0 and top_p=1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        self.check()
        # Other number types (np.float32(0.7), np.int64(50)) are welcome, stored as Python float / int.
        for name, kind in (("temperature", float), ("top_k", int), ("top_p", float)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    def check(self) -> "SamplingParams":
        """A ValueError naming the argument and its value unless the settings make sense; returns
        self. ``generate``, ``generate_batch`` and the scheduler call it again, so settings changed
        after construction (``object.__setattr__`` on the frozen fields, an unpickled object whose
        state was edited) are refused there too instead of failing deep inside torch."""
        t, k, p = self.temperature, self.top_k, self.top_p
        # NaN slips through a plain "< 0" test (every comparison with NaN is False) and would only
        # surface later as a torch error far from its cause; infinity would silently mean uniform.
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = no top-k filter), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 = no nucleus filter), got {p!r}")
        return self

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits in the last dimension (ties at the boundary are kept), -inf elsewhere."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (the top one always)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of strictly better tokens
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def logits_to_probs(logits: torch.Tensor, params: SamplingParams = GREEDY) -> torch.Tensor:
    """Probabilities (float32, last dim = vocabulary) after temperature, top-k and top-p.

    Greedy (temperature 0) returns the one-hot distribution on the argmax: the limit of the
    tempered softmax as temperature goes to 0, which makes rejection sampling reduce to greedy
    verification.
    """
    logits = logits.float()
    if params.is_greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    logits = apply_top_k(logits, params.top_k)
    logits = apply_top_p(logits, params.top_p)
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of ``probs`` ([..., V]) -> LongTensor [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None):
    """Argmax when greedy, else a sample from the processed distribution."""
    if params.is_greedy:
        return logits.argmax(-1)
    return sample(logits_to_probs(logits, params), generator)
