"""Several independent drafts at once: m sampled chains of k tokens, verified as one tree.

When the request samples, a drafter can draw m chains independently from its own q (SpecInfer,
Miao et al. 2023; SpecTr, Sun et al. 2023). Side by side under the root they form a tree of m*k
nodes, each row of ``Draft.probs`` the q its token was drawn from, and ``tree_rejection_sample``
verifies them losslessly: the first chain's first token is tried against p, on rejection the
residual is tried against the second chain's, and so on (verify.py proves why the output still
follows the target). With one draft of m*k tokens the step can only go deep; with m drafts of k
it gets m tries at the first position. Every try after the first is tested against the residual
max(p - q, 0), so it can only succeed on tokens q under-proposes: the extra tries pay when the
drafter's other candidates are likely enough to be right, not merely when its first is often wrong.

The chains are not merged where they start alike: merging would make the children at a node
something other than independent draws from q, and the sibling rule above needs exactly that.
Chains drawn without replacement (distinct first tokens) would break it too: they can be verified
as fixed candidates (draft_probs=None, which ignores q) or by a rule made for them, such as the
recursive rejection sampling of Recursive Speculative Decoding (Jeon et al. 2024).

The verification forward scores m*k + 1 positions whatever the shape, so tokens per step compares
shapes at equal verification cost. Drafting cost is a property of this wrapper, not of the shapes:
it asks the inner drafter for one chain after another, each re-fed from the last committed token,
so a step costs m*k draft forwards (the draft model's k per chain) whatever m is. In general the m
chains could be drafted in k forwards batched over the chains, and m one-token drafts in a single
forward, since all of them are draws from the same q.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..trees import ROOT
from .base import DecodeState, Draft, Proposer, ProposerWrapper, StepOutcome, check_k


class IndependentDrafts(ProposerWrapper):
    """``num_drafts`` chains from ``proposer`` (each ``proposer.k`` long), returned as one tree.

    proposer: a chain drafter that samples its tokens from q (``draft_sampling="sample"``: the
    draft model, EAGLE's chain) and rolls its own state back to the committed tokens in
    ``on_verified`` (the draft model's rule: keep every committed token but the last). At
    temperature 0 the chains would all be the same argmax chain, so greedy requests get one.
    """

    def __init__(self, proposer: Proposer, num_drafts: int = 2):
        if not isinstance(num_drafts, int) or isinstance(num_drafts, bool) or num_drafts < 1:
            raise ValueError(f"num_drafts must be an int >= 1, got {num_drafts!r}")
        if proposer.scores_draft:
            raise ValueError(f"{proposer!r} verifies its own chain in the target's cache; it cannot draft a tree")
        if proposer.draft_sampling != "sample":
            raise ValueError(f"{proposer!r} drafts deterministically (draft_sampling={proposer.draft_sampling!r}): "
                             "independent drafts must be sampled from q, so pass draft_sampling='sample'")
        super().__init__(proposer)
        self.num_drafts = num_drafts
        self.name = f"{proposer.name}x{num_drafts}"

    @property
    def k(self) -> int:
        """The tree's node budget: num_drafts chains of the drafter's k."""
        return self.num_drafts * self.proposer.k

    @k.setter
    def k(self, value: int) -> None:
        value = check_k(value)
        if value % self.num_drafts:
            raise ValueError(f"k={value} is not {self.num_drafts} drafts of equal length")
        self.proposer.k = value // self.num_drafts

    def _discard(self, state: DecodeState, chain: Draft) -> None:
        # An outcome that keeps no draft and commits nothing new: the drafter rolls back to
        # "every committed token but the last", ready to draw the next chain from the same point.
        self.proposer.on_verified(state, StepOutcome(chain, 0, [state.token_list[-1]]))

    def propose(self, state: DecodeState) -> Draft:
        m = 1 if state.sampling.is_greedy else self.num_drafts
        chains = []
        for _ in range(m):
            chain = self.proposer.propose(state)
            if chain.is_tree:
                raise ValueError(f"{self.proposer!r} drafted a tree; IndependentDrafts needs chains")
            if len(chain) and chain.probs is None and not state.sampling.is_greedy:
                raise ValueError(f"{self.proposer!r} returned no q for its sampled chain")
            self._discard(state, chain)
            if len(chain):
                chains.append(chain)
        if not chains:
            return Draft.empty(state.device)
        if len(chains) == 1:
            return chains[0]
        tokens = torch.cat([c.tokens for c in chains])
        probs = torch.cat([c.probs for c in chains])
        parents, start = [], 0
        for c in chains:
            parents += [ROOT] + [start + i for i in range(len(c) - 1)]
            start += len(c)
        return Draft(tokens, probs, torch.tensor(parents, dtype=torch.long, device=tokens.device))

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        # The drafter already holds no drafted token (each chain was discarded): nothing it kept
        # can disagree with the accepted path, whichever chain that was.
        self.proposer.on_verified(state, replace(outcome, num_accepted=0, accepted_nodes=None))

    def __repr__(self) -> str:
        return f"IndependentDrafts({self.proposer!r}, num_drafts={self.num_drafts})"
