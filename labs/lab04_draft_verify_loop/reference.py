"""Lab 4 with the reference package switched in: the same names as student.py, over
``specdecode_ref.kv`` (the cache API), ``specdecode_ref.verify.greedy_verify`` (acceptance) and the
engine's input checks. The package's own loop (``specdecode_ref.engine.generate``) drives a
proposer object and also handles sampling and EOS; the loop here is the same algorithm written
out for two bare models, with the same cache invariant (see engine.py and student.py)."""
from __future__ import annotations

import torch

from specdecode_ref import kv
from specdecode_ref.request import validate_prompt
from specdecode_ref.verify import greedy_verify


def _as_list(ids) -> list:
    return [int(t) for t in torch.as_tensor(ids).reshape(-1).tolist()]


def _forward(model, cache, ids: list, keep: int) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    return model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits[0, -keep:]


def _check_k(k):
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")


@torch.no_grad()
def draft_tokens(draft_model, draft_cache, pending_ids, k):
    _check_k(k)
    ids = _as_list(pending_ids)
    if not ids:
        raise ValueError("pending_ids is empty: feed at least the last committed token")
    out = []
    for _ in range(k):
        out.append(int(_forward(draft_model, draft_cache, ids, 1)[-1].argmax()))
        ids = out[-1:]
    return out


@torch.no_grad()
def verify_greedy(target_model, target_cache, pending_ids, drafted):
    pending, drafted = _as_list(pending_ids), _as_list(drafted)
    if not pending:
        raise ValueError("pending_ids is empty: feed at least the last committed token")
    logits = _forward(target_model, target_cache, pending + drafted, len(drafted) + 1)
    tokens, num_accepted = greedy_verify(logits[None], torch.tensor([drafted], dtype=torch.long,
                                                                     device=logits.device))
    a = int(num_accepted[0])
    return a, tokens[0, : a + 1].tolist()


def rollback(cache, keep_len):
    if not isinstance(keep_len, int) or isinstance(keep_len, bool):
        raise ValueError(f"keep_len must be an int, got {keep_len!r}")
    kv.crop_to(cache, keep_len)  # raises ValueError outside [0, cache length]


def speculative_greedy(target_model, draft_model, prompt_ids, k, max_new_tokens, on_step=None):
    _check_k(k)
    prompt = validate_prompt(target_model, prompt_ids, max_new_tokens)  # empty prompt, budget, window
    vt = target_model.get_output_embeddings().weight.shape[0]
    vd = draft_model.get_output_embeddings().weight.shape[0]
    if vt != vd:
        raise ValueError(f"the draft model's vocabulary has {vd} tokens, the target's {vt}: they must share one")
    tokens = prompt.tolist()
    target_cache, draft_cache = kv.new_cache(target_model), kv.new_cache(draft_model)
    result = {"tokens": [], "accepted": [], "drafted": [], "target_forwards": 0, "draft_forwards": 0}
    while len(result["tokens"]) < max_new_tokens:
        remaining = max_new_tokens - len(result["tokens"])
        k_step = min(k, remaining)
        drafted = draft_tokens(draft_model, draft_cache, tokens[kv.cache_len(draft_cache):], k_step)
        a, emitted = verify_greedy(target_model, target_cache, tokens[kv.cache_len(target_cache):], drafted)
        emitted = emitted[:remaining]
        tokens += emitted
        result["tokens"] += emitted
        result["accepted"].append(a)
        result["drafted"].append(k_step)
        result["target_forwards"] += 1
        result["draft_forwards"] += k_step
        rollback(target_cache, len(tokens) - 1)
        rollback(draft_cache, min(len(tokens) - 1, kv.cache_len(draft_cache)))
        if on_step is not None:
            on_step(list(tokens), target_cache, draft_cache)
    return result
