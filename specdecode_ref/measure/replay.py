"""Offline replays of greedy speculative decoding: the engine's step rule without the model.

Under greedy verification a drafted token is accepted exactly when it equals the target's greedy
token, and the target's output does not depend on the draft. So once the plain greedy
continuation of a prompt is known, every step of a speculative run follows from what the drafter
would offer at each point: how many tokens, and how many of them lead the continuation. Replays
answer "what would tau (or the modelled speedup) be for k = 1..16, for this controller, for this
cost curve" in milliseconds instead of minutes of decoding.

:func:`chain_steps` is the step rule, as in ``engine.generate`` (it lives in analysis.py with the
chain replay; both are re-exported here): draft at most ``remaining - 1`` tokens (the budget),
accept the leading run of matches, emit it plus one target token (or stop at the continuation's
end, an EOS). The three replays build on it:

* :func:`replay_greedy_chain` (a model-based chain drafter, from one bit per position:
  ``bench.draft_greedy_matches``, notebook 05);
* :func:`replay` (an adaptive-K controller over an n-gram match profile, notebook 03);
* ``ngram_analysis.replay_greedy`` (the n-gram proposer itself, with the source of every copied
  token, notebook 04).

A replay equals the engine's counters whenever the engine's run reproduces the continuation
token for token (always in fp32 greedy decoding; in bf16 a near-tie can flip a token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

# The step rule and the chain replay sit in analysis.py (the model, which imports no tooling).
from ..analysis import ChainStep, as_verify_cost, chain_steps, replay_greedy_chain


def step_cost(drafted: int, verify_cost=1.0, c: float = 0.0, c_step: float = 0.0) -> float:
    """Cost of one step in units of T(1): c_step + drafted * c + V(drafted), a plain step's V = 1."""
    v = as_verify_cost(verify_cost)
    return c_step + drafted * c + (float(v(drafted)) if drafted > 0 else 1.0)


def draft_match_profile(proposer, prompt: Sequence[int], continuation: Sequence[int], k_max: int = 16):
    """For a proposer with a ``lookup(tokens) -> draft list`` method (NgramProposer), return
    ``(available, matched)``: arrays over j = 1..len(continuation)-1 (j tokens already generated)
    with the draft length it offers at most (0 = no draft) and how many leading draft tokens
    equal the greedy continuation. Under greedy verification a draft of length n accepts
    exactly min(n, matched[j]) tokens, because an n-gram draft of length n is the first n
    tokens of the draft of length k_max. continuation: the plain greedy output (first token included).
    """
    if not hasattr(proposer, "lookup"):
        raise TypeError("draft_match_profile needs a proposer with a lookup(tokens) method (e.g. NgramProposer)")
    saved = proposer.k
    proposer.k = int(k_max)
    try:
        if hasattr(proposer, "_reset"):
            proposer._reset()
        ctx = list(map(int, prompt))
        cont = list(map(int, continuation))
        n = len(cont)
        available = np.zeros(max(n - 1, 0), dtype=int)
        matched = np.zeros(max(n - 1, 0), dtype=int)
        ctx.append(cont[0])
        for j in range(1, n):
            draft = proposer.lookup(ctx)
            available[j - 1] = len(draft)
            matched[j - 1] = leading_matches(draft, cont, j)
            ctx.append(cont[j])
        return available, matched
    finally:
        proposer.k = saved


def leading_matches(draft: Sequence[int], continuation: Sequence[int], start: int) -> int:
    """How many leading tokens of ``draft`` equal ``continuation[start:]``."""
    m = 0
    while m < len(draft) and start + m < len(continuation) and draft[m] == continuation[start + m]:
        m += 1
    return m


@dataclass
class ReplayResult:
    tokens: int  # new tokens, the prefill's first one included
    steps: int
    cost: float  # decode cost in units of T(1) (prefill excluded)
    records: list  # StepRecord per step

    @property
    def tau(self) -> float:
        return (self.tokens - 1) / self.steps if self.steps else float("nan")

    @property
    def speedup(self) -> float:
        """Modelled decode-phase speedup over plain decoding (plain: one T(1) per token)."""
        return (self.tokens - 1) / self.cost if self.cost else float("nan")


def replay(controller, available: Sequence[int], matched: Sequence[int], verify_cost=1.0,
           c: float = 0.0, c_step: float = 0.0) -> ReplayResult:
    """Run an adaptive-K ``controller`` (proposers.adaptive) over a match profile
    (:func:`draft_match_profile`) as the engine would under greedy decoding, charging each step
    c_step + n*c + V(n) (V(0) = 1: a plain step). The controller's own state is reset first; its
    ``history`` holds the replayed steps."""
    v = as_verify_cost(verify_cost)
    available = np.asarray(available, dtype=int)
    matched = np.asarray(matched, dtype=int)
    total = available.size + 1  # new tokens of the request, the first one from prefill
    controller.start_request()
    steps, cost = 0, 0.0
    # The offer reads controller.k when the step starts: after observe() moved it.
    for s in chain_steps(total, lambda g: (min(controller.k, int(available[g - 1])), int(matched[g - 1]))):
        cost += step_cost(s.drafted, v, c, c_step)
        controller.observe(s.drafted, s.accepted)
        steps += 1
    return ReplayResult(tokens=total, steps=steps, cost=cost, records=list(controller.history))


__all__ = ["ChainStep", "chain_steps", "step_cost", "replay_greedy_chain", "draft_match_profile",
           "leading_matches", "ReplayResult", "replay"]
