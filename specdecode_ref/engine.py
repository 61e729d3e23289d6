"""The draft-verify-rollback loop, and plain autoregressive decoding through the same code path.

Invariant: the target's KV cache holds every committed token except the last one. ``generate``
repeats one step of four parts until EOS or max_new_tokens:

1. propose: the proposer drafts up to k tokens (a chain) or a tree (``_propose``), cut to what
   could still be emitted;
2. score: one target forward over the last committed token plus the draft, k+1 positions;
3. verify: keep a prefix of the draft (a root-to-node path of a tree) and add one target token,
   then roll the target cache back to the committed length minus one (``_chain_step`` crops it,
   ``_tree_step`` compacts it to the accepted path);
4. commit: append the emitted tokens, stop at EOS or max_new_tokens, count them in SpecStats and
   let the proposer roll back its own state (``request.Request.commit``).

Plain decoding is the same step with an empty draft, so ``autoregressive_generate`` and
``generate`` share every line that touches the target. A tree draft (trees.py) is scored with a
tree attention mask and depth-based position ids.

Counterparts: transformers ``generation/utils.py`` (``_assisted_decoding``), vLLM
``vllm/v1/spec_decode`` with ``vllm/v1/sample/rejection_sampler.py``.
"""
from __future__ import annotations

import time

import torch

from . import kv, trees
from .proposers.base import DecodeState, Draft, Proposer, step_hidden_states
from .request import (ACCEPTED, BONUS, RECOVERED, TARGET, GenerationResult, Request, Verdict, as_int, as_prompt,
                      check_positive_int, check_sampling_and_proposer, check_seed, context_window, drafting,
                      eos_token_ids, sync, validate_prompt)
from .sampling import SamplingParams, logits_to_probs, next_token
from .verify import (VERIFICATION, block_verify, check_verification, greedy_verify, refuse_block_for_tree,
                     rejection_sample, tree_greedy_verify,
                     tree_rejection_sample, typical_accept)

# The request-level names (request.py) stay importable from here, where notebooks and labs find them.
__all__ = ["ACCEPTED", "BONUS", "RECOVERED", "TARGET", "TREE_ACCEPTANCE", "VERIFICATION", "GenerationResult", "as_int", "as_prompt",
           "autoregressive_generate", "check_positive_int", "check_seed", "context_window", "eos_token_ids",
           "generate", "validate_prompt"]


def _to_device(ids, device) -> torch.Tensor:
    """Token ids (a list or tensor) as a LongTensor on ``device``. A Python list copied straight to
    a GPU is a synchronous copy: the host waits for every kernel queued before it. Through pinned
    memory the copy is queued like a kernel, so a step syncs only where the engine reads a token."""
    if isinstance(ids, torch.Tensor) or device.type != "cuda":
        return torch.as_tensor(ids, dtype=torch.long, device=device)
    return torch.tensor(ids, dtype=torch.long).pin_memory().to(device, non_blocking=True)


class _Target:
    """The target model with its KV cache: the one code path for plain and speculative decoding."""

    def __init__(self, model, want_hidden: bool):
        self.model = model
        self.cache = kv.new_cache(model)
        self.want_hidden = want_hidden
        self.device = next(model.parameters()).device
        self.forwards = 0
        self.time_s = 0.0

    def forward(self, ids: list | torch.Tensor, last_only: bool = False, attention_mask=None, position_ids=None):
        """Score ``ids`` [n] after the cached prefix; returns (logits [n or 1, V], hidden states:
        per layer [n, H], or None).

        attention_mask / position_ids: a custom 4D mask [1, 1, n, past + n] and the matching
        positions [1, n] (tree drafts, see trees.py); None lets the model build the ordinary causal ones.
        """
        t0 = time.perf_counter()
        x = _to_device(ids, self.device).reshape(1, -1)
        kwargs = {"logits_to_keep": 1} if last_only else {}
        if attention_mask is not None:
            kwargs.update(attention_mask=attention_mask, position_ids=position_ids)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True,
                         output_hidden_states=self.want_hidden, **kwargs)
        self.cache = out.past_key_values
        self.forwards += 1
        hidden = tuple(h[0] for h in out.hidden_states) if self.want_hidden else None
        logits = out.logits[0]
        self.time_s += time.perf_counter() - t0
        return logits, hidden

    def score_with(self, scorer, state, ids: list):
        """Let a proposer run the verification forward itself in this cache (early exit reuses the
        draft's first-layer keys and values instead of recomputing them); timed and counted alike."""
        t0 = time.perf_counter()
        logits = scorer(state, ids)
        self.forwards += 1
        self.time_s += time.perf_counter() - t0
        return logits, None


TREE_ACCEPTANCE = ("lossless", "typical")


def _chain_step(target: _Target, state: DecodeState, draft: Draft, sampling: SamplingParams, generator,
                scorer, verification: str = "token") -> Verdict:
    """Score [last committed] + a chain of n >= 0 drafted tokens, verify, crop the target cache.
    n = 0 is plain decoding: the target's next token alone."""
    n, committed = len(draft), len(state.token_list)
    ids = [state.token_list[-1]] + draft.tokens.tolist()
    # Score: the n+1 positions in one forward, or by the proposer's own scorer (early exit).
    logits, hidden = target.forward(ids) if scorer is None else target.score_with(scorer, state, ids)
    # Verify: the accepted prefix, then one target token (recovered, or a bonus if all passed).
    if n == 0:
        emitted, num_accepted = [int(next_token(logits[-1], sampling, generator))], 0
    else:
        draft_tokens = draft.tokens.to(target.device).long()[None]
        if sampling.is_greedy:
            out, acc = greedy_verify(logits[None], draft_tokens)
        else:
            q = None if draft.probs is None else draft.probs[None]
            verify = block_verify if verification == "block" else rejection_sample
            out, acc = verify(logits_to_probs(logits, sampling)[None], draft_tokens, q, generator)
        num_accepted = int(acc[0])
        emitted = out[0, : num_accepted + 1].tolist()
    # Roll the target cache back to the committed prefix (minus the newest token).
    kv.crop_to(target.cache, committed + num_accepted)
    hidden = None if hidden is None else tuple(h[: num_accepted + 1] for h in hidden)
    return Verdict.of_chain(draft, emitted, num_accepted, hidden)


def _tree_step(target: _Target, state: DecodeState, draft: Draft, sampling: SamplingParams, generator,
               tree_acceptance: str) -> Verdict:
    """Score [last committed] + a tree of n >= 1 nodes in one forward with a tree attention mask,
    verify, compact the target cache to the committed prefix plus the accepted path."""
    device, parents = target.device, draft.parents  # parents validated on the CPU by request.clip_draft
    past_len = kv.cache_len(target.cache)  # the committed tokens except the last one (the root)
    dtype = target.model.get_input_embeddings().weight.dtype
    tokens = draft.tokens.to(device).long()
    # Score: every node sees the prefix, the root and its own ancestors, at position past_len + depth.
    mask = trees.tree_attention_mask(parents, past_len, dtype=dtype, device=device)
    position_ids = trees.tree_position_ids(parents, past_len, device=device)
    logits, hidden = target.forward([state.token_list[-1]] + tokens.tolist(), attention_mask=mask,
                                    position_ids=position_ids)
    # Verify: the accepted root-to-node path, then one target token.
    if sampling.is_greedy:
        path, emitted = tree_greedy_verify(logits, parents, tokens)
    else:
        probs = logits_to_probs(logits, sampling)
        if tree_acceptance == "typical":
            path, emitted = typical_accept(probs, parents, tokens, generator)
        else:
            q = None if draft.probs is None else draft.probs.to(device)
            path, emitted = tree_rejection_sample(probs, parents, tokens, generator, q)
    path = path.tolist()
    # Keep the committed prefix, the root and the accepted path: the path's keys were computed at
    # positions past_len + depth, i.e. consecutive, exactly as if it had been fed as a chain.
    kv.keep_positions(target.cache, trees.kept_positions(past_len, path))
    if hidden is not None:
        slots = torch.tensor([0] + [i + 1 for i in path], dtype=torch.long, device=device)
        hidden = tuple(h.index_select(0, slots.to(h.device)) for h in hidden)
    last_slot = path[-1] + 1 if path else 0
    ends_at_leaf = not bool((parents == last_slot - 1).any())
    return Verdict(emitted.tolist(), len(path), ends_at_leaf, hidden, path)


def _propose(proposer: Proposer | None, request: Request, device, tree_acceptance: str) -> Draft:
    """The proposer's draft, checked, and cut to what this step could still emit."""
    if proposer is None:
        return Draft.empty(device)
    state = request.state
    draft = request.timed(proposer.propose, state)
    if tree_acceptance == "typical" and not state.sampling.is_greedy and not draft.is_tree and len(draft) > 0:
        draft = Draft(draft.tokens, draft.probs, trees.chain_parents(len(draft)))
    return request.take_draft(proposer, draft)


def _check_arguments(model, input_ids, proposer, max_new_tokens, sampling, tree_acceptance, verification="token"):
    """Clear errors for bad input; returns (sampling, the prompt as a 1-D LongTensor)."""
    if tree_acceptance not in TREE_ACCEPTANCE:
        raise ValueError(f"tree_acceptance must be one of {TREE_ACCEPTANCE}, got {tree_acceptance!r}")
    check_verification(verification)
    if verification == "block" and tree_acceptance == "typical":
        raise ValueError("verification='block' judges a chain as a whole; tree_acceptance='typical' is Medusa's "
                         "own rule for trees: choose one")
    sampling = check_sampling_and_proposer(model, sampling, proposer)
    return sampling, validate_prompt(model, input_ids, max_new_tokens)


@torch.inference_mode()
def generate(model, input_ids, proposer: Proposer | None = None, max_new_tokens: int = 128,
             sampling: SamplingParams | None = None, seed: int | None = 0,
             eos_token_id=None, stop_on_eos: bool = True, tree_acceptance: str = "lossless",
             verification: str = "token") -> GenerationResult:
    """Speculative decoding with ``proposer`` (plain decoding when None). Lossless: greedy output
    equals plain greedy decoding; sampled output follows the target's distribution.

    input_ids: 1-D (or [1, L]) prompt ids. sampling: SamplingParams (default greedy).
    seed: seeds the request's one torch.Generator. Generation stops after max_new_tokens tokens
    exactly, or at the first EOS (included in the output) unless stop_on_eos=False.

    Tree drafts (``Draft.parents`` set, see trees.py) are scored in one target forward with a tree
    attention mask; the target cache is then compacted to the accepted path. Nodes deeper than
    the token budget or the context window are dropped. tree_acceptance (sampling only; greedy
    always verifies greedily): "lossless" = multi-candidate rejection sampling
    (verify.tree_rejection_sample), "typical" = Medusa's typical acceptance (verify.typical_accept),
    which is LOSSY: the output no longer follows the target's distribution. "typical" also
    applies to chain drafts (verified as a one-branch tree).
    verification (chain drafts, sampling; greedy is the same either way): "token" =
    token-by-token rejection sampling (verify.rejection_sample), "block" = block verification
    (verify.block_verify: the draft judged as a whole, lossless, never fewer tokens kept in
    expectation). Tree drafts refuse "block".
    """
    sampling, prompt = _check_arguments(model, input_ids, proposer, max_new_tokens, sampling, tree_acceptance,
                                        verification)
    proposer = drafting(proposer)
    eos = set(eos_token_ids(model, eos_token_id)) if stop_on_eos else set()
    request = Request.start(model, prompt, sampling, check_seed(seed), max_new_tokens, eos, proposer)
    state, generator = request.state, request.state.generator
    target = _Target(model, want_hidden=proposer is not None and proposer.needs_hidden_states)
    scorer = proposer.score if proposer is not None and proposer.scores_draft else None
    device = target.device

    sync(device)
    t_start = time.perf_counter()
    # Prefill: the whole prompt; its last position gives the first new token.
    logits, state.prompt_hidden_states = target.forward(prompt, last_only=True)
    request.stats.prefill_time_s = target.time_s
    request.commit_first(logits[-1])
    state.target_cache = target.cache
    if proposer is not None:
        request.timed(proposer.begin, state)

    while not request.done:
        if proposer is not None:  # a router knows after begin whether its choice reads hidden states
            target.want_hidden = step_hidden_states(proposer)
        # 1. Propose: up to k tokens (a chain) or a tree, cut to what could still be emitted.
        draft = _propose(proposer, request, device, tree_acceptance)
        # 2. Score the last committed token plus the draft in one target forward, 3. verify, and
        #    roll the target cache back to what verification kept.
        if draft.is_tree and len(draft) > 0:
            refuse_block_for_tree(verification)
            verdict = _tree_step(target, state, draft, sampling, generator, tree_acceptance)
        else:
            verdict = _chain_step(target, state, draft, sampling, generator, scorer, verification)
        # 4. Commit the emitted tokens (up to EOS and max_new_tokens); the proposer rolls back.
        request.commit(draft, verdict)

    sync(device)
    request.stats.wall_time_s = time.perf_counter() - t_start
    request.stats.target_forwards = target.forwards
    request.stats.target_time_s = target.time_s
    return request.result()


def autoregressive_generate(model, input_ids, max_new_tokens: int = 128,
                            sampling: SamplingParams | None = None, seed: int | None = 0,
                            eos_token_id=None, stop_on_eos: bool = True) -> GenerationResult:
    """Plain decoding, one target forward per token: the baseline every proposer must match."""
    return generate(model, input_ids, proposer=None, max_new_tokens=max_new_tokens, sampling=sampling,
                    seed=seed, eos_token_id=eos_token_id, stop_on_eos=stop_on_eos)
