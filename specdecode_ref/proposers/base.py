"""The proposer interface: what every drafter (n-gram, draft model, early exit, Medusa, EAGLE) implements.

One engine step (see engine.py): ``propose`` returns a :class:`Draft`; the target scores the last
committed token plus the draft in one forward; verification keeps a prefix; ``on_verified`` tells
the proposer what was committed so it can roll back its own state (a draft model's KV cache,
EAGLE's feature cache). Proposers that read the target's hidden states (Medusa, EAGLE, early-exit
adapters) set ``needs_hidden_states``; the engine then hands them the target's hidden states for
the prompt in ``begin`` and for every committed position in ``on_verified``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from ..sampling import SamplingParams

#: How a drafter picks its tokens when the request samples (temperature > 0). "sample": draw each
#: token from q, the drafter's own distribution processed like the target's, and report q, so
#: rejection sampling accepts with probability sum_x min(p, q) = 1 - TV(p, q). "greedy": propose the
#: drafter's argmax a* and report nothing (q one-hot on a*), accepted with probability p(a*), as
#: vLLM's drafters do. Both are lossless; which accepts more is analysis.acceptance_with_q versus
#: analysis.acceptance_one_hot. At temperature 0 both are the same argmax drafting.
DRAFT_SAMPLING = ("sample", "greedy")


def resolve_draft_sampling(mode, default: str = "sample", can_sample: bool = True,
                           who: str = "this proposer") -> str:
    """The drafting mode a proposer uses: ``mode`` ("sample", "greedy", or None for ``default``),
    checked. A proposer whose candidates are deterministic (copied n-grams, top-k tree children)
    has no q to draw from: ``can_sample=False`` lets it accept only "greedy"."""
    mode = default if mode is None else mode
    if mode not in DRAFT_SAMPLING:
        raise ValueError(f"draft_sampling must be one of {DRAFT_SAMPLING} (or None for the default), got {mode!r}")
    if mode == "sample" and not can_sample:
        raise ValueError(f"{who} proposes deterministic candidates (q one-hot on each of them): "
                         "draft_sampling must be 'greedy'")
    return mode


@dataclass
class Draft:
    """Up to k drafted tokens, a chain or a tree.

    tokens: LongTensor [n], n <= k (n may be 0: nothing to propose, the step decodes one token plainly).
    probs: FloatTensor [n, V], the proposer's distribution q at each drafted position, processed
        with the request's SamplingParams; None for a deterministic proposer (q one-hot). For a
        tree, row i is the distribution node i was drawn from (siblings drawn independently).
    parents: LongTensor [n] of parent indices for a tree draft (``trees.ROOT`` = -1: the last
        committed token); None for a chain, where token i's parent is i - 1.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    parents: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @staticmethod
    def empty(device=None) -> "Draft":
        return Draft(torch.empty(0, dtype=torch.long, device=device))


@dataclass
class DecodeState:
    """What a proposer may read about the request being decoded (owned by the engine)."""

    target: torch.nn.Module
    sampling: SamplingParams
    generator: torch.Generator | None
    prompt_len: int
    token_list: list = field(default_factory=list)  # committed ids: prompt + generated
    prompt_hidden_states: tuple | None = None  # per layer [prompt_len, H] (needs_hidden_states only)
    target_cache: object = None  # the target's KV cache (read-only for all but self-speculative drafts)

    @property
    def num_tokens(self) -> int:
        return len(self.token_list)

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def tokens(self) -> torch.Tensor:
        """Committed ids, a LongTensor [num_tokens] on the target's device."""
        return torch.tensor(self.token_list, dtype=torch.long, device=self.device)


@dataclass
class StepOutcome:
    """What one verification step committed."""

    draft: Draft
    num_accepted: int
    emitted: list  # [num_accepted + 1] ids appended this step: accepted drafts, one target token; EOS may cut it
    hidden_states: tuple | None = None  # per layer [num_accepted + 1, H]: positions last, d1..d_acc
    accepted_nodes: list | None = None  # tree drafts: [num_accepted] accepted node indices, root side first


class Proposer(ABC):
    """Base class of all drafters. Subclasses set ``k`` and implement ``propose``.

    Everything else the engine relies on is declared here, with a default that suits a proposer
    reading only token ids (n-gram); a drafter overrides what it needs. A wrapper
    (adaptive.AdaptiveK) forwards every one of them to the proposer it wraps:

    * ``check_compatible(target)``: refuse a target it cannot draft for, before anything runs;
    * ``begin(state)`` / ``on_verified(state, outcome)``: start a request; roll its own state
      back after each step;
    * ``needs_hidden_states``: the engine collects the target's hidden states for both;
    * ``scores_draft`` with ``score(state, ids)``: the proposer runs the verification forward
      itself (early exit: the draft already wrote the first layers' keys and values).

    * ``draft_sampling``: "greedy" (deterministic candidates, q one-hot) or "sample" (tokens
      drawn from the drafter's q, returned in ``Draft.probs``) when the request samples; see
      ``DRAFT_SAMPLING``. The engine does not read it (``Draft.probs`` says what q was); it
      tells a measurement which regime a drafter ran in.

    Drafting a tree needs no declaration: a proposer returns a Draft with ``parents``.
    """

    name = "proposer"
    draft_sampling = "greedy"  # model-based chain drafters default to "sample" (their constructors)
    needs_hidden_states = False  # True: receive the target's hidden states in begin and on_verified
    scores_draft = False  # True: the engine calls score() instead of its own verification forward

    def __init__(self, k: int):
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k (tokens drafted per step) must be an int >= 1, got {k!r}")
        self.k = k

    def check_compatible(self, target) -> None:
        """Raise a clear error when this proposer cannot draft for ``target`` (e.g. vocabulary)."""

    def begin(self, state: DecodeState) -> None:
        """A new request starts (prompt in ``state.token_list``): reset or prefill own state."""

    @abstractmethod
    def propose(self, state: DecodeState) -> Draft:
        """Draft up to ``self.k`` tokens continuing ``state.token_list``: a Draft with tokens [n],
        probs [n, V] or None, parents [n] (a tree) or None (a chain)."""

    def score(self, state: DecodeState, ids: list) -> torch.Tensor:
        """The verification forward, run by the proposer (only when ``scores_draft``).

        ids: [n+1] token ids, the last committed token then a chain draft of n tokens. Must return
        the target's logits [n+1, V], exactly those of a plain target forward, and leave the target
        cache (``state.target_cache``) holding these n+1 positions in every layer, as that forward
        would: the engine then crops it to what verification kept.
        """
        raise NotImplementedError(f"{type(self).__name__} sets scores_draft but does not implement score()")

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Roll back own state to the committed tokens (``state.token_list`` is already updated)."""

    def batch_proposer(self):
        """A BatchProposer drafting for every row of a batch (generate_batch, see proposers/batch.py).
        The default drives one copy of this proposer per row; drafters that can share a forward
        across rows (the draft model) override it."""
        from .batch import PerRowBatchProposer

        return PerRowBatchProposer(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k})"
