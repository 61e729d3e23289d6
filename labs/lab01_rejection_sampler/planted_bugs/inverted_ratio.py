"""Planted bug: the acceptance test is inverted, accepting with probability min(1, q/p). Drafts
the target considers unlikely now pass most easily.

caught by: test_accept_mask_examples, test_first_token_follows_p, test_acceptance_rate_is_overlap
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def accept_mask(p_draft, q_draft, u):
    return u * p_draft < q_draft
