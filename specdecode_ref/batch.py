"""Batched speculative decoding: many requests, ragged acceptance, one target forward per step.

Every row is its own request. Per step each active row drafts 0..k tokens or a tree (rows may
differ), ONE target forward scores ``[last committed] + draft`` of every row (tree rows with their
own tree mask, ``score_and_verify``), each row is verified on its own (its own acceptance length,
its own generator), and each row's cache is rolled back to its own committed length. Rows that
hit EOS or their token budget leave the batch. Row i's output equals
``generate(model, prompts[i], ..., seed=seed + i)`` (greedy: token for token in fp32).

The rows share one padded KV cache (ragged_cache.py: each slot carries the position of the key it
holds, so one rule gives every row its own causal mask, hides padding and rejected drafts, and
rolls a row back without copying). Each row is a ``request.Request``, exactly as in ``generate``:
the same first-token draw, draft clipping, commit, token kinds and result.

Seeds: row i's generator is seeded with ``seed + i`` (or ``seed[i]`` when a list is given), so
one row's seed never changes another row's output, and a batch of N copies of one prompt draws N
independent samples.

Counterparts: vLLM ``vllm/v1/spec_decode/`` (drafters for a whole batch),
``vllm/v1/sample/rejection_sampler.py`` (one flat tensor of drafts with per-request offsets
``cu_num_draft_tokens``), ``vllm/v1/core/sched/scheduler.py`` (``num_lookahead_tokens``, rollback
of ``num_computed_tokens`` for rejected drafts).
"""
from __future__ import annotations

import time

import torch

from . import trees
from .proposers.base import Draft, Proposer
# The padded cache moved to ragged_cache.py; its names stay importable from here.
from .ragged_cache import (COMPACT_FRACTION, EMPTY_SLOT, RaggedCache, check_compact_fraction,  # noqa: F401
                           compaction_index, left_pad_layout, rollback_slot_positions, row_parents)
from .request import (Request, Verdict, check_sampling_and_proposer, check_seed, drafting, eos_token_ids, sync,
                      validate_prompt)
from .sampling import SamplingParams, logits_to_probs, next_token
from .verify import (PLACEHOLDER_TOKEN_ID, block_verify, check_verification, greedy_verify, refuse_block_for_tree,
                     rejection_sample, tree_greedy_verify, tree_rejection_sample)


def _as_seeds(seed, n: int) -> list:
    if isinstance(seed, (list, tuple)):
        if len(seed) != n:
            raise ValueError(f"got {len(seed)} seeds for {n} prompts: pass one int (row i gets seed + i) or one per prompt")
        return [check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]
    seed = check_seed(seed)
    return [seed + i for i in range(n)]


def prompt_list(prompts, who: str = "generate_batch") -> list:
    """``prompts`` as a non-empty list: a TypeError for one tensor or a non-sequence, a ValueError
    when there is no prompt (``who`` names the API in the message)."""
    if isinstance(prompts, torch.Tensor):
        raise TypeError("prompts must be a list of 1-D LongTensors (rows of different lengths), not one tensor; "
                        "use list(tensor) for a [B, L] tensor without padding")
    try:
        prompts = list(prompts)
    except TypeError:
        raise TypeError(f"prompts must be a list of 1-D LongTensors, got {type(prompts).__name__}") from None
    if not prompts:
        raise ValueError(f"the prompt list is empty: {who} needs at least one prompt")
    return prompts


def for_row(i: int, check, *args, what: str = "prompt"):
    """``check(*args)``, with its ValueError / TypeError naming the row: "prompt 3: ..."."""
    try:
        return check(*args)
    except (ValueError, TypeError) as err:
        raise type(err)(f"{what} {i}: {err}") from None


def validate_prompts(model, prompts, max_new_tokens, who: str = "generate_batch") -> tuple:
    """Every prompt checked as ``generate`` checks one, the offending row named; returns (prompts as
    1-D LongTensors, one max_new_tokens per prompt)."""
    prompts = prompt_list(prompts, who)
    if isinstance(max_new_tokens, (list, tuple)):
        if len(max_new_tokens) != len(prompts):
            raise ValueError(f"got {len(max_new_tokens)} max_new_tokens for {len(prompts)} prompts")
        budgets = list(max_new_tokens)
    else:
        budgets = [max_new_tokens] * len(prompts)
    return [for_row(i, validate_prompt, model, p, m) for i, (p, m) in enumerate(zip(prompts, budgets))], budgets


def greedy_verify_rows(logits: torch.Tensor, drafts: list):
    """Greedy verification of every row in one call. logits: [B, N, V] with row b's
    ``len(drafts[b]) + 1`` positions right-aligned (left padding); drafts: one list of ids per row
    (padded to the longest with PLACEHOLDER_TOKEN_ID, which is never accepted).
    Returns ([emitted ids per row], [num_accepted per row])."""
    b, n, v = logits.shape
    lens = torch.tensor([len(d) for d in drafts], device=logits.device)
    k = int(lens.max())
    offs = torch.arange(k + 1, device=logits.device)
    cols = (n - 1 - lens)[:, None] + torch.minimum(offs[None], lens[:, None])  # row b's own offset
    scores = logits.gather(1, cols[:, :, None].expand(b, k + 1, v))
    draft_tokens = torch.full((b, k), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=logits.device)
    for r, d in enumerate(drafts):
        if len(d):
            draft_tokens[r, : len(d)] = torch.as_tensor(d, dtype=torch.long, device=logits.device)
    out, acc = greedy_verify(scores, draft_tokens)
    acc, out = acc.tolist(), out.tolist()
    return [out[r][: acc[r] + 1] for r in range(b)], acc


def verify_rows(logits: torch.Tensor, drafts: list, sampling: SamplingParams, generators: list,
                verification: str = "token"):
    """Verify every row's draft against its own slice of the target's logits.

    logits: [B, N, V], row b's ``len(drafts[b]) + 1`` positions right-aligned (left padding).
    Greedy: one ``greedy_verify`` call for the whole batch, drafts padded with PLACEHOLDER_TOKEN_ID (never accepted)
    and each row's scores gathered from its own offset, as vLLM's rejection sampler reads a flat
    batch through per-request offsets. Sampling: one ``rejection_sample`` call per row, since
    each row draws from its own generator exactly as ``generate`` would for that request alone,
    token by token or as a block (``verification``, as ``generate``'s).
    Returns ([emitted ids per row], [num_accepted per row]).
    """
    b, n, v = logits.shape
    if sampling.is_greedy:
        return greedy_verify_rows(logits, [d.tokens.tolist() for d in drafts])
    emitted, accepted = [], []
    for r, d in enumerate(drafts):
        rows = logits[r, n - (len(d) + 1):]
        if len(d) == 0:  # the same draws as generate() makes for an empty draft
            emitted.append([int(next_token(rows[-1], sampling, generators[r]))])
            accepted.append(0)
            continue
        probs = logits_to_probs(rows, sampling)
        q = None if d.probs is None else d.probs.to(logits.device)[None]
        verify = block_verify if verification == "block" else rejection_sample
        out, acc = verify(probs[None], d.tokens.to(logits.device).long()[None], q, generators[r])
        a = int(acc[0])
        emitted.append(out[0, : a + 1].tolist())
        accepted.append(a)
    return emitted, accepted


def verify_tree_row(logits: torch.Tensor, draft: Draft, sampling: SamplingParams, generator) -> Verdict:
    """One row's tree draft verified as ``generate`` verifies it (engine._tree_step): logits
    [n+1, V], row 0 the root (the last committed token), row i+1 node i."""
    tokens = draft.tokens.to(logits.device).long()
    if sampling.is_greedy:
        path, emitted = tree_greedy_verify(logits, draft.parents, tokens)
    else:
        q = None if draft.probs is None else draft.probs.to(logits.device)
        path, emitted = tree_rejection_sample(logits_to_probs(logits, sampling), draft.parents, tokens, generator, q)
    path = path.tolist()
    last = path[-1] if path else trees.ROOT
    ends_at_leaf = not bool((draft.parents == last).any())
    return Verdict(emitted.tolist(), len(path), ends_at_leaf, None, path)


def score_and_verify(cache: RaggedCache, rows: list, drafts: list, sampling: SamplingParams,
                     want_hidden: bool = False, verification: str = "token") -> list:
    """One batched step for the rows of ``cache``: score, verify, roll back. The one place where a
    batch (generate_batch) or a running server (the scheduler) meets the target.

    rows: per cache row its ``request.Request``, or None for a row with nothing to do this step
    (it feeds nothing and keeps its cache). drafts: per cache row a Draft, a chain or a tree
    (ignored for None rows). Each working row feeds its committed tokens not yet in the cache
    (the last committed token at least: the root) and then its draft, all rows in ONE forward;
    tree rows get their own tree mask and depth positions (RaggedCache.forward). Each row is then
    verified on its own, exactly as ``generate`` verifies that request alone, and its cache rolled
    back to its committed length minus one (tree nodes off the accepted path are discarded).

    Returns per cache row its Verdict (None for idle rows); with ``want_hidden`` each Verdict
    carries the target's hidden states at the root and the accepted tokens, per layer
    [num_accepted + 1, H], as ``generate`` hands them to drafters that read them.
    verification: "token" or "block" for sampled chain rows (``generate``'s argument).
    """
    work = [j for j, r in enumerate(rows) if r is not None]
    pending = {j: rows[j].state.token_list[cache.lengths[j]:] for j in work}
    for j in work:
        if not pending[j]:
            raise RuntimeError(f"row {j}: the cache already holds every committed token; nothing to score")
    tree_rows = {j for j in work if drafts[j].is_tree and len(drafts[j])}
    if tree_rows:
        refuse_block_for_tree(verification)
    rows_ids = [[] for _ in rows]
    parents = [None for _ in rows]
    for j in work:
        rows_ids[j] = pending[j] + drafts[j].tokens.tolist()
        if j in tree_rows:
            parents[j] = row_parents(len(pending[j]), drafts[j].parents)
    lengths_before = list(cache.lengths)
    kwargs = {"output_hidden_states": True} if want_hidden else {}
    out = cache.forward(rows_ids, parents=parents, **kwargs)
    width = out.logits.shape[1]
    # Column of each working row's root (its last committed token) in the left-padded forward.
    root = {j: width - len(rows_ids[j]) + len(pending[j]) - 1 for j in work}

    verdicts = [None for _ in rows]
    chains = [j for j in work if j not in tree_rows]
    if chains:  # the chain rows' drafts end at the right edge: verify_rows reads them right-aligned
        index = torch.tensor(chains, device=out.logits.device)
        emitted, accepted = verify_rows(out.logits.index_select(0, index), [drafts[j] for j in chains], sampling,
                                        [rows[j].state.generator for j in chains], verification)
        for j, em, a in zip(chains, emitted, accepted):
            verdicts[j] = Verdict.of_chain(drafts[j], em, a)
    for j in sorted(tree_rows):
        verdicts[j] = verify_tree_row(out.logits[j, root[j]:], drafts[j], sampling, rows[j].state.generator)

    keep = list(cache.lengths)
    for j in work:
        v = verdicts[j]
        # The accepted nodes (a chain's are its first num_accepted), as indices into the draft.
        path = v.accepted_nodes if j in tree_rows else list(range(v.num_accepted))
        if j in tree_rows:
            first_node = cache.num_slots - width + root[j] + 1
            off_path = set(range(len(drafts[j]))) - set(path)
            cache.discard(j, [first_node + i for i in sorted(off_path)])
        keep[j] = lengths_before[j] + len(pending[j]) + v.num_accepted
        if want_hidden:
            cols = torch.tensor([root[j]] + [root[j] + 1 + i for i in path], device=out.hidden_states[0].device)
            v.hidden = tuple(h[j].index_select(0, cols) for h in out.hidden_states)
    cache.rollback(keep)
    return verdicts


def row_hidden_states(hidden_states: tuple, row: int, length: int) -> tuple:
    """Row ``row``'s own hidden states from a left-padded forward: per layer [length, H] (its last
    ``length`` columns)."""
    return tuple(h[row, h.shape[1] - length:] for h in hidden_states)


@torch.inference_mode()
def generate_batch(model, prompts, proposer: Proposer | None = None, max_new_tokens=128,
                   sampling: SamplingParams | None = None, seed=0, eos_token_id=None,
                   stop_on_eos: bool = True, compact_fraction: float = COMPACT_FRACTION,
                   verification: str = "token") -> list:
    """Speculative decoding of many requests at once; returns one GenerationResult per prompt, in order.

    prompts: list of 1-D LongTensors [L_i] (different lengths welcome). proposer: any proposer
        ``generate`` accepts (None = plain batched decoding), chains and trees; it drafts for all
        rows through ``proposer.batch_proposer()`` (the draft model and early exit in one forward
        per draft position for all rows; n-gram, Medusa, Hydra and EAGLE one copy per row, fed
        each row's own hidden states). Tree drafts of all rows are verified in the same one
        forward, each row with its own tree mask. Medusa's typical acceptance is ``generate``'s only.
    max_new_tokens: int, or one per prompt. sampling: SamplingParams (default greedy), shared.
    seed: int (row i's generator gets ``seed + i``) or a list of one seed per prompt; so row i's
        output equals ``generate(model, prompts[i], proposer, ..., seed=seed + i)``.
    compact_fraction: compact the padded cache when more than this share of it is holes.
    verification: "token" or "block" for sampled chain drafts, as in ``generate``.

    Each result's ``stats`` counts that row's drafts, acceptances and steps; ``target_forwards``
    the batched forwards it took part in; ``wall_time_s`` runs from the start of the batch to the
    row's last token (a row waits for the whole batch at every step).
    """
    sampling = check_sampling_and_proposer(model, sampling, proposer)
    proposer = drafting(proposer)
    prompts, budgets = validate_prompts(model, prompts, max_new_tokens)
    seeds = _as_seeds(seed, len(prompts))
    compact_fraction = check_compact_fraction(compact_fraction)
    verification = check_verification(verification)
    batch_proposer = None if proposer is None else proposer.batch_proposer()
    want_hidden = batch_proposer is not None and batch_proposer.needs_hidden_states
    eos = set(eos_token_ids(model, eos_token_id)) if stop_on_eos else set()
    device = next(model.parameters()).device
    # Each row is a request as generate() keeps it (EOS, budget, kinds, SpecStats); the batch
    # proposer, not the row, is told the outcome of each step.
    rows = [Request.start(model, p, sampling, s, m, eos) for p, m, s in zip(prompts, budgets, seeds)]

    pad = getattr(model.config, "pad_token_id", None)
    target = RaggedCache(model, len(rows), pad_token_id=0 if pad is None else int(pad))
    sync(device)
    t_start = time.perf_counter()

    # Prefill: all prompts in one forward, left-padded; the last column is every row's last token.
    out = target.forward([r.state.token_list for r in rows], logits_to_keep=1, output_hidden_states=want_hidden)
    prefill_s = target.time_s
    for b, row in enumerate(rows):
        row.commit_first(out.logits[b, -1])
        row.stats.prefill_time_s = row.stats.target_time_s = prefill_s
        row.stats.target_forwards = 1
        if want_hidden:
            row.state.prompt_hidden_states = row_hidden_states(out.hidden_states, b, row.state.prompt_len)
    del out
    if batch_proposer is not None:
        _timed_for_all(rows, batch_proposer.begin, [r.state for r in rows])
    active = _retire(rows, list(range(len(rows))), target, batch_proposer, t_start, device)

    while active:
        live = [rows[i] for i in active]
        states = [r.state for r in live]
        # 1. Propose for every row (a chain or a tree), each draft cut to what its row could still emit.
        if batch_proposer is not None:
            drafts = _timed_for_all(live, batch_proposer.propose, states)
            if len(drafts) != len(live):
                raise RuntimeError(f"{batch_proposer!r} returned {len(drafts)} drafts for {len(live)} rows")
            drafts = [row.take_draft(batch_proposer.row_proposer(j), d) for j, (row, d) in enumerate(zip(live, drafts))]
        else:
            drafts = [Draft.empty(device) for _ in live]
        # 2. Score every row's [last committed] + draft in one forward, 3. verify each row on its own
        #    and roll each row back to its own committed length (minus the newest token).
        t0 = target.time_s
        verdicts = score_and_verify(target, live, drafts, sampling, want_hidden, verification)
        step_s = target.time_s - t0
        # 4. Commit each row's tokens; the batch proposer rolls every row back.
        outcomes = []
        for row, d, v in zip(live, drafts, verdicts):
            outcomes.append(row.commit(d, v))
            row.stats.target_forwards += 1
            row.stats.target_time_s += step_s
        if batch_proposer is not None:
            _timed_for_all(live, batch_proposer.on_verified, states, outcomes)
        active = _retire(rows, active, target, batch_proposer, t_start, device)
        if active:
            target.maybe_compact(compact_fraction)

    return [row.result() for row in rows]


def _timed_for_all(rows: list, fn, *args):
    """Call a batch proposer hook, charging its time to every row's drafting (they wait for it together)."""
    t0 = time.perf_counter()
    out = fn(*args)
    dt = time.perf_counter() - t0
    for row in rows:
        row.stats.draft_time_s += dt
    return out


def _retire(rows, active: list, target: RaggedCache, batch_proposer, t_start: float, device) -> list:
    """Finished rows leave the batch: their cache rows (target and drafter) are dropped."""
    stay = [j for j, i in enumerate(active) if not rows[i].done]
    if len(stay) == len(active):
        return active
    sync(device)
    now = time.perf_counter() - t_start
    for i in active:
        if rows[i].done and rows[i].stats.wall_time_s == 0.0:
            rows[i].stats.wall_time_s = now
    if stay:
        target.select_rows(stay)
        if batch_proposer is not None:
            batch_proposer.keep_rows(stay)
    return [active[j] for j in stay]
