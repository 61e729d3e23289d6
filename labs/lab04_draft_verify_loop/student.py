"""Lab 4 — the draft-verify loop with KV-cache rollback. Fill in the four functions below.

Greedy speculative decoding with a draft *model*: two Hugging Face causal LMs that share a
vocabulary, one request (batch 1), each model with its own KV cache (a transformers
``DynamicCache``; ``model(input_ids=..., past_key_values=cache, use_cache=True)`` appends the new
positions to ``cache`` in place). Use ``specdecode_ref.kv`` for the cache: ``kv.new_cache(model)``,
``kv.cache_len(cache)`` and ``kv.crop_to(cache, length)`` (transformers changed the meaning of
``DynamicCache.crop`` between versions; ``kv`` hides that).

``tokens`` below means the committed ids: the prompt plus every new token emitted so far.
One step of the loop, with n = len(tokens) before the step:

1. draft: the draft model first reads the committed tokens its cache has not seen
   (``tokens[kv.cache_len(draft_cache):]``, the *pending* tokens), then proposes k tokens
   d_1..d_k greedily, one forward per token;
2. verify: ONE target forward over the target's pending tokens followed by d_1..d_k; the target's
   argmax at the last pending position checks d_1, the argmax after d_i checks d_(i+1), and the
   argmax after d_k is the bonus. Accept the longest prefix d_1..d_a that equals the target's
   argmax, then emit one target token (the correction at position a+1, or the bonus if a = k);
3. roll back: both caches now hold positions for drafts that were rejected. Crop them so that
   they hold committed tokens only.

THE CACHE INVARIANT (checked after every step by the grading tests):

* target cache: every committed token except the last, i.e. ``len(tokens) - 1`` positions.
  The last committed token is always pending: the next verify forward starts with it.
* draft cache: every committed token except the last, too -- except after a step that accepted
  all k drafts and emitted the bonus: the draft never fed d_k to itself (d_k was its last
  output), so its cache then ends before d_k and holds ``len(tokens) - 2`` positions; d_k and
  the bonus are both pending at the next step. In one formula: after a step, crop the draft
  cache to ``min(len(tokens) - 1, kv.cache_len(draft_cache))``.

At the very start both caches are empty and the whole prompt is pending: the first step's
draft forward and target forward read the prompt (there is no separate prefill), so the number
of target forwards equals the number of steps.

Greedy speculative decoding is lossless: whatever the draft proposes, the new tokens must equal
plain greedy decoding of the target (``specdecode_ref.autoregressive_generate`` with
``stop_on_eos=False``) token for token. This lab does not stop at EOS: it always generates
exactly max_new_tokens tokens.
"""
from __future__ import annotations

import torch  # noqa: F401  (you will need it)

from specdecode_ref import kv  # noqa: F401  (new_cache, cache_len, crop_to)


def draft_tokens(draft_model, draft_cache, pending_ids, k):
    """Feed the pending tokens to the draft model, then draft k tokens greedily.

    pending_ids: the committed tokens ``draft_cache`` has not seen yet (a list or 1-D tensor of
    ids, at least one: the last committed token; two after a step that accepted everything; the
    whole prompt at the first step). Feed them in ONE forward: the argmax at its last position is
    d_1. Then feed d_1 alone to get d_2, and so on: k forwards in all (d_k itself is not fed).
    The cache grows in place by ``len(pending_ids) + k - 1`` positions.

    Returns the k drafted ids as a list of ints. Raise ValueError if k < 1 or pending_ids is
    empty. Run the model under ``torch.no_grad()``; ``logits_to_keep=1`` saves work.
    """
    raise NotImplementedError("draft_tokens: catch up on the pending tokens, then k greedy draft steps")


def verify_greedy(target_model, target_cache, pending_ids, drafted):
    """One target forward over ``pending_ids + drafted``; return ``(num_accepted, emitted)``.

    pending_ids: the committed tokens ``target_cache`` has not seen (the last committed token;
    the whole prompt at the first step). drafted: the draft's tokens (list or 1-D tensor, may
    be empty). Position len(pending_ids) - 1 + i of the output predicts the token after
    drafted[i - 1]; only the last len(drafted) + 1 positions matter (``logits_to_keep``).

    num_accepted a: the length of the longest prefix of drafted that equals the target's argmax
    at the matching positions. emitted: ``drafted[:a]`` followed by the target's argmax at the
    first mismatch (the correction) or, when all are accepted, after the last draft (the bonus):
    a list of a + 1 ints. Do not roll the cache back here (the loop does): it grows by
    ``len(pending_ids) + len(drafted)`` positions.
    """
    raise NotImplementedError("verify_greedy: one forward, accepted prefix, correction or bonus")


def rollback(cache, keep_len):
    """Crop ``cache`` in place to its first ``keep_len`` positions (the committed prefix).

    Use ``kv.crop_to``. Raise ValueError when keep_len is negative or longer than the cache
    (a rollback can only shorten it); keep_len equal to the current length is a no-op.
    """
    raise NotImplementedError("rollback: crop the cache to keep_len positions")


def speculative_greedy(target_model, draft_model, prompt_ids, k, max_new_tokens, on_step=None):
    """Greedy speculative decoding of ``prompt_ids`` (a list or 1-D tensor of ids).

    Make one cache per model (``kv.new_cache(model)``), then repeat the step of the module
    docstring until max_new_tokens new tokens are committed:

    * draft ``k_step = min(k, remaining)`` tokens, remaining = max_new_tokens - tokens so far
      (never draft a token that could not be emitted);
    * verify them with one target forward; keep only the first ``remaining`` emitted tokens
      (when all drafts pass, the bonus may not fit the budget: drop it);
    * append the emitted tokens, then roll back both caches to the invariant above;
    * if on_step is given, call ``on_step(tokens, target_cache, draft_cache)`` after the
      rollback, with tokens = a list of all committed ids (prompt + new).

    Raise ValueError for k < 1, max_new_tokens < 1, an empty prompt, or a draft model whose
    vocabulary size (``model.get_output_embeddings().weight.shape[0]``) differs from the target's.

    Returns a dict:
        "tokens":          list of the max_new_tokens new ids (the prompt excluded)
        "accepted":        list, per step, of the number of accepted drafts a
        "drafted":         list, per step, of k_step
        "target_forwards": number of target forward passes (one per step)
        "draft_forwards":  number of draft forward passes (k_step per step)
    """
    raise NotImplementedError("speculative_greedy: draft, verify, roll back both caches, repeat")
