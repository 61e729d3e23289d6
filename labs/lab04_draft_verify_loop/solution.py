"""Lab 4 — a worked solution, written the way a student would (for instructors)."""
from __future__ import annotations

import torch

from specdecode_ref import kv


def _device(model):
    return next(model.parameters()).device


def _ids(xs) -> list:
    return [int(t) for t in torch.as_tensor(xs).reshape(-1).tolist()]


def _next_logits(model, cache, ids, keep):
    """Feed ``ids`` after what ``cache`` holds (it grows in place); the logits of the last ``keep`` positions."""
    x = torch.tensor([ids], dtype=torch.long, device=_device(model))
    out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


def _vocab(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def draft_tokens(draft_model, draft_cache, pending_ids, k):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    pending = _ids(pending_ids)
    if not pending:
        raise ValueError("pending_ids is empty: the draft needs at least the last committed token")
    drafted = []
    with torch.no_grad():
        logits = _next_logits(draft_model, draft_cache, pending, 1)  # catch up, and draft #1
        drafted.append(int(logits[-1].argmax()))
        for _ in range(k - 1):  # each draft token is fed back to get the next one
            logits = _next_logits(draft_model, draft_cache, [drafted[-1]], 1)
            drafted.append(int(logits[-1].argmax()))
    return drafted


def verify_greedy(target_model, target_cache, pending_ids, drafted):
    pending = _ids(pending_ids)
    drafted = _ids(drafted)
    if not pending:
        raise ValueError("pending_ids is empty: the target needs at least the last committed token")
    with torch.no_grad():
        # The last len(drafted) + 1 positions: the last committed token and each draft.
        logits = _next_logits(target_model, target_cache, pending + drafted, len(drafted) + 1)
    best = logits.argmax(dim=-1).tolist()
    a = 0
    while a < len(drafted) and drafted[a] == best[a]:
        a += 1
    return a, drafted[:a] + [best[a]]  # best[a]: the correction, or the bonus when a == len(drafted)


def rollback(cache, keep_len):
    if not isinstance(keep_len, int) or isinstance(keep_len, bool):
        raise ValueError(f"keep_len must be an int, got {keep_len!r}")
    if keep_len < 0 or keep_len > kv.cache_len(cache):
        raise ValueError(f"cannot roll a cache of {kv.cache_len(cache)} positions back to {keep_len}")
    kv.crop_to(cache, keep_len)


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

    target_cache = kv.new_cache(target_model)
    draft_cache = kv.new_cache(draft_model)
    accepted, drafted_counts = [], []
    target_forwards = draft_forwards = 0
    while len(tokens) - prompt_len < max_new_tokens:
        remaining = max_new_tokens - (len(tokens) - prompt_len)
        k_step = min(k, remaining)
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
