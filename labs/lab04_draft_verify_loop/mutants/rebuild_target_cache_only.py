"""Mutant: the draft cache is kept and rolled back, but the target cache is created afresh at
every step ("verification must see the whole context"): the target re-reads everything.

caught by: test_caches_reused_not_rebuilt, test_cache_invariant_after_every_step
"""
from __future__ import annotations

from specdecode_ref import kv

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def speculative_greedy(target_model, draft_model, prompt_ids, k, max_new_tokens, on_step=None):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if _vocab(target_model) != _vocab(draft_model):
        raise ValueError(f"draft vocabulary ({_vocab(draft_model)}) differs from the target's "
                         f"({_vocab(target_model)}): the two models must share a tokenizer")
    tokens = _ids(prompt_ids)
    if not tokens:
        raise ValueError("the prompt is empty")
    prompt_len = len(tokens)

    draft_cache = kv.new_cache(draft_model)
    accepted, drafted_counts = [], []
    target_forwards = draft_forwards = 0
    while len(tokens) - prompt_len < max_new_tokens:
        remaining = max_new_tokens - (len(tokens) - prompt_len)
        k_step = min(k, remaining)
        target_cache = kv.new_cache(target_model)  # BUG: a fresh target cache every step
        # 1. draft: the draft first reads what it has not seen yet (1 token, 2 after a full accept,
        #    the whole prompt at the first step)
        drafted = draft_tokens(draft_model, draft_cache, tokens[kv.cache_len(draft_cache):], k_step)
        draft_forwards += k_step
        # 2. verify: one target forward over its unseen tokens plus the drafts
        a, emitted = verify_greedy(target_model, target_cache, tokens[kv.cache_len(target_cache):], drafted)
        target_forwards += 1
        emitted = emitted[:remaining]  # the bonus token may not fit the budget
        tokens += emitted
        accepted.append(a)
        drafted_counts.append(k_step)
        # 3. roll back: both caches keep only committed tokens, all but the last
        rollback(target_cache, len(tokens) - 1)
        rollback(draft_cache, min(len(tokens) - 1, kv.cache_len(draft_cache)))
        if on_step is not None:
            on_step(list(tokens), target_cache, draft_cache)
    return {"tokens": tokens[prompt_len:], "accepted": accepted, "drafted": drafted_counts,
            "target_forwards": target_forwards, "draft_forwards": draft_forwards}
