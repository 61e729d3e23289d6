"""The chain-drafting loop the model-based drafters share: pick a token, feed it back, repeat.

The draft model, early exit and EAGLE (chain mode) differ only in how they turn the last token
into the next logits; choosing the token is the same for all three. Greedy decoding takes the
argmax (q is not needed: greedy verification compares tokens). Sampling draws from q, the draft's
distribution after the same processing the target's gets (temperature, top-k, top-p), over the
full vocabulary so that q and p line up id for id, and returns q for rejection sampling.

``draft_sampling="greedy"`` (base.DRAFT_SAMPLING) takes the argmax even when the request samples
and returns no q: rejection sampling then treats the draft as one-hot, which is just as lossless
(accept with probability p(a*), else draw from p with a* removed). vLLM drafts this way: its EAGLE
proposer takes ``logits.argmax(dim=-1)`` (``vllm/v1/spec_decode/eagle.py``) and the model runner
passes ``None`` as draft_probs to the rejection sampler (``vllm/v1/worker/gpu_model_runner.py``),
whose kernels then use draft probability 1 for the draft token
(``vllm/v1/sample/rejection_sampler.py``, the ``IS_NGRAM`` branch).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..sampling import logits_to_probs
from .base import DecodeState, Draft
from .vocab import VocabHead


def choose_token(logits: torch.Tensor, state: DecodeState, vocab: VocabHead | None = None,
                 widen: Callable | None = None, draft_sampling: str = "sample"):
    """The next draft token from ``logits`` [V_draft] and, when sampling, q [V] it was drawn from.

    vocab: the reduced vocabulary the logits are over (None: the full one). widen: maps full-size
    logits onto the target's vocabulary when the draft's differs (draft_model.fit_logits).
    draft_sampling: "greedy" returns the argmax and no q at any temperature (q one-hot).
    """
    if state.sampling.is_greedy or draft_sampling == "greedy":
        index = logits.argmax()
        return int(index if vocab is None else vocab.to_token(index)), None
    full = logits if vocab is None else vocab.full_logits(logits)
    if widen is not None:
        full = widen(full)
    q = logits_to_probs(full.float(), state.sampling)
    return int(torch.multinomial(q, 1, generator=state.generator)), q


def draft_chain(k: int, logits: torch.Tensor, advance: Callable[[int, int], torch.Tensor], state: DecodeState,
                device, vocab: VocabHead | None = None, widen: Callable | None = None,
                draft_sampling: str = "sample") -> Draft:
    """Draft ``k`` tokens: choose from ``logits``, then ``advance(token, i)`` feeds draft token i
    to the drafter and returns the logits for token i + 1 (never called after the last token).
    Returns tokens [k] and, when sampling with draft_sampling="sample", probs [k, V]."""
    tokens, probs = [], []
    for i in range(k):
        tok, q = choose_token(logits, state, vocab, widen, draft_sampling)
        tokens.append(tok)
        if q is not None:
            probs.append(q)
        if i + 1 < k:
            logits = advance(tok, i)
    return Draft(torch.tensor(tokens, dtype=torch.long, device=device), torch.stack(probs) if probs else None)


def choose_tokens(logits: torch.Tensor, state: DecodeState, device, vocab: VocabHead | None = None,
                  draft_sampling: str = "sample") -> Draft:
    """A chain whose positions are drafted independently of each other (Medusa's heads read one
    feature each): row i of ``logits`` [n, V_draft] gives token i. Each row's token is chosen as in
    :func:`choose_token`; q_i does not depend on the tokens before i, which rejection sampling
    allows (it only needs the q each token was really drawn from)."""
    chosen = [choose_token(row, state, vocab, None, draft_sampling) for row in logits]
    probs = [q for _, q in chosen if q is not None]
    return Draft(torch.tensor([t for t, _ in chosen], dtype=torch.long, device=device),
                 torch.stack(probs) if probs else None)


__all__ = ["choose_token", "choose_tokens", "draft_chain"]
