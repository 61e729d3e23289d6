"""Planted bug: the draft cache is rolled back one position too far (to len(tokens) - 2, "the
last two are pending"). Decoding stays correct -- the next step re-feeds the missing token -- but
every step recomputes a position for nothing and the cache breaks the lab's invariant.

caught by: test_cache_invariant_after_every_step, test_every_acceptance_length
"""
from __future__ import annotations

from specdecode_ref import kv

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())  # the worked solution, one function replaced below


@patch
def speculative_greedy(target_model, draft_model, prompt_ids, k, max_new_tokens, on_step=None):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if _vocab(target_model) != _vocab(draft_model):
        raise ValueError("draft and target vocabularies differ")
    tokens = _ids(prompt_ids)
    if not tokens:
        raise ValueError("the prompt is empty")
    prompt_len = len(tokens)
    target_cache = kv.new_cache(target_model)
    draft_cache = kv.new_cache(draft_model)
    accepted, drafted_counts = [], []
    target_forwards = draft_forwards = 0
    while len(tokens) - prompt_len < max_new_tokens:
        remaining = max_new_tokens - (len(tokens) - prompt_len)
        k_step = min(k, remaining)
        drafted = draft_tokens(draft_model, draft_cache, tokens[kv.cache_len(draft_cache):], k_step)
        draft_forwards += k_step
        a, emitted = verify_greedy(target_model, target_cache, tokens[kv.cache_len(target_cache):], drafted)
        target_forwards += 1
        emitted = emitted[:remaining]
        tokens += emitted
        accepted.append(a)
        drafted_counts.append(k_step)
        rollback(target_cache, len(tokens) - 1)
        rollback(draft_cache, min(len(tokens) - 2, kv.cache_len(draft_cache)))  # BUG: one too short
        if on_step is not None:
            on_step(list(tokens), target_cache, draft_cache)
    return {"tokens": tokens[prompt_len:], "accepted": accepted, "drafted": drafted_counts,
            "target_forwards": target_forwards, "draft_forwards": draft_forwards}
