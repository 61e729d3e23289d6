"""Batched speculative decoding: many requests, ragged acceptance, one target forward per step.

Every row is its own request. Per step each active row drafts 0..k tokens (rows may differ), ONE
target forward scores ``[last committed] + draft`` of every row, each row is verified on its own
(its own acceptance length, its own generator), and each row's cache is rolled back to its own
committed length. Rows that hit EOS or their token budget leave the batch. Row i's output equals
``generate(model, prompts[i], ..., seed=seed + i)`` (greedy: token for token in fp32).

How the ragged batch sits in the cache (the design choice). A paged KV cache (vLLM
``vllm/v1/core/kv_cache_manager.py`` allocates blocks, ``vllm/v1/worker/block_table.py`` maps
each request's positions to physical slots; transformers ``generation/continuous_batching/cache.py``
``PagedAttentionCache`` does the same with read/write indices) needs an attention kernel that
reads keys through a block table. On this CPU, with transformers' stock ``DynamicCache`` and the
eager/SDPA attention, the practical choice is a *padded* cache: one ``[B, heads, S, head_dim]``
tensor per layer, where every slot s of row b carries the *position* of the key it holds,
``slot_pos[b, s]`` (-1 for an empty slot: padding, a rejected draft, a finished neighbour's
column). Then one rule gives the 4-D attention mask: a query of row b at position p sees exactly
the slots of row b with ``0 <= slot_pos <= p``. That single rule hides left padding, hides
rejected drafts after rollback, and is causal inside the step; position ids are per row (the
row's own length), so rotary embeddings match what the request would see alone. Rollback is
bookkeeping only (mark slots with ``slot_pos >= keep`` empty, no copy, like vLLM's rollback of
``num_computed_tokens``); new tokens are appended at the end for all rows, so holes accumulate and
the cache is *compacted* (each row's live slots gathered to the front) when more than half of
it is holes. Finished rows are removed from the batch dimension. transformers' cache API stays
inside kv.py (``select_rows``, ``gather_slots``, ``crop_to``).

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

from . import kv
from .engine import (ACCEPTED, BONUS, RECOVERED, TARGET, GenerationResult, _check_draft,
                     _check_sampling_and_proposer, _Request, _sync, _validate, check_seed, context_window,
                     eos_token_ids)
from .masks import ragged_attention_mask
from .proposers.base import DecodeState, Draft, Proposer, StepOutcome
from .sampling import SamplingParams, logits_to_probs, next_token
from .verify import greedy_verify, rejection_sample

# Compact the cache when more than this share of its slots are holes.
COMPACT_FRACTION = 0.5


def left_pad_layout(rows_ids: list, lengths: list, pad_token_id: int = 0, device=None):
    """Left-pad each row's new tokens into ids [B, N] (N = the longest row); query positions [B, N]
    continue each row at its own length ``lengths[b]`` (-1 marks padding)."""
    n = max(len(r) for r in rows_ids)
    ids = torch.full((len(rows_ids), n), pad_token_id, dtype=torch.long)
    pos = torch.full((len(rows_ids), n), -1, dtype=torch.long)
    for b, row in enumerate(rows_ids):
        if len(row):
            ids[b, n - len(row):] = torch.as_tensor(row, dtype=torch.long)
            pos[b, n - len(row):] = torch.arange(lengths[b], lengths[b] + len(row))
    return ids.to(device), pos.to(device)


def rollback_slot_positions(slot_pos: torch.Tensor, keep: list) -> torch.Tensor:
    """Row b keeps positions 0..keep[b]-1: every slot holding a later position becomes empty (-1).
    slot_pos: LongTensor [B, S]; returns a new [B, S] tensor (nothing is copied in the cache)."""
    keep_t = torch.as_tensor(keep, dtype=torch.long, device=slot_pos.device)
    return slot_pos.masked_fill(slot_pos >= keep_t[:, None], -1)


def compaction_index(slot_pos: torch.Tensor):
    """Where each row's live slots go when the cache is compacted: (index [B, W], new slot_pos
    [B, W]) with W the most live slots of any row; row b's live slots in position order, at the
    end of its row (left padding, index pointing at any slot, slot_pos -1)."""
    width = int((slot_pos >= 0).sum(1).max()) if slot_pos.numel() else 0
    sorted_pos, idx = torch.sort(slot_pos, dim=1, stable=True)  # empty (-1) first, then by position
    s = slot_pos.shape[1]
    return idx[:, s - width:], sorted_pos[:, s - width:]


class RaggedCache:
    """A padded KV cache for B rows of different lengths (see the module docstring).

    lengths[b]: positions row b holds (its keys sit at positions 0..lengths[b]-1, anywhere in the
    row); slot_pos: LongTensor [B, S] with each slot's position or -1.
    """

    def __init__(self, model, num_rows: int, pad_token_id: int = 0):
        self.model = model
        self.cache = kv.new_cache(model)
        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.slot_pos = torch.empty(num_rows, 0, dtype=torch.long, device=self.device)
        self.lengths = [0] * num_rows
        self.pad_token_id = pad_token_id
        self.forwards = 0
        self.time_s = 0.0

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    @property
    def num_slots(self) -> int:
        return int(self.slot_pos.shape[1])

    def layout(self, rows_ids: list):
        return left_pad_layout(rows_ids, self.lengths, self.pad_token_id, self.device)

    def position_ids(self, query_pos: torch.Tensor) -> torch.Tensor:
        """Each row's own positions [B, N] (padding at 0): row b continues at ``lengths[b]``.
        Left to the model, positions would follow the padded column instead, and a row's rotary
        phases would depend on its neighbours' lengths and on the holes of rejected drafts."""
        return query_pos.clamp(min=0)

    def forward(self, rows_ids: list, module=None, **kwargs):
        """Append each row's new tokens (``rows_ids[b]``, a list of ids, may be empty) and run
        ``module`` (default: the model) on them in one forward; returns its output.

        The new tokens are left-padded, so column -1 holds every non-empty row's last token
        (``logits_to_keep=1`` works), and row b's tokens are columns ``N - len(rows_ids[b]):``.
        """
        if len(rows_ids) != self.num_rows:
            raise ValueError(f"{len(rows_ids)} rows of ids for a cache of {self.num_rows} rows")
        t0 = time.perf_counter()
        ids, query_pos = self.layout(rows_ids)
        slot_pos = torch.cat([self.slot_pos, query_pos], dim=1)
        mask = ragged_attention_mask(slot_pos, query_pos, self.dtype)
        module = self.model if module is None else module
        out = module(input_ids=ids, attention_mask=mask, position_ids=self.position_ids(query_pos),
                     past_key_values=self.cache, use_cache=True, **kwargs)
        self.cache = out.past_key_values
        self.slot_pos = slot_pos
        self.lengths = [length + len(row) for length, row in zip(self.lengths, rows_ids)]
        self.forwards += 1
        self.time_s += time.perf_counter() - t0
        return out

    def rollback(self, keep: list) -> None:
        """Row b keeps its first ``keep[b]`` positions; later slots (rejected drafts) become empty."""
        if len(keep) != self.num_rows:
            raise ValueError(f"{len(keep)} rollback lengths for {self.num_rows} rows")
        for b, (k, length) in enumerate(zip(keep, self.lengths)):
            if not 0 <= k <= length:
                raise ValueError(f"row {b}: cannot roll back a row of {length} positions to {k}")
        self.slot_pos = rollback_slot_positions(self.slot_pos, keep)
        self.lengths = list(keep)

    def truncate(self, num_slots: int) -> None:
        """Drop every slot from ``num_slots`` on (all rows): undo forwards, e.g. between timed runs."""
        kv.crop_to(self.cache, num_slots)
        self.slot_pos = self.slot_pos[:, :num_slots]
        self.lengths = [int(x) for x in (self.slot_pos >= 0).sum(1).tolist()]

    def select_rows(self, rows: list) -> None:
        """Keep only the rows ``rows`` (indices into the current rows, in the new order)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        kv.select_rows(self.cache, idx)
        self.slot_pos = self.slot_pos.index_select(0, idx)
        self.lengths = [self.lengths[r] for r in rows]

    def holes(self) -> float:
        """Share of the cache's slots that hold no live key."""
        total = self.slot_pos.numel()
        return 0.0 if total == 0 else 1.0 - sum(self.lengths) / total

    def compact(self) -> None:
        """Gather each row's live slots, in position order, to the end of its row (left padding)."""
        idx, self.slot_pos = compaction_index(self.slot_pos)
        kv.gather_slots(self.cache, idx)

    def maybe_compact(self, fraction: float = COMPACT_FRACTION) -> bool:
        if self.num_slots and self.holes() > fraction:
            self.compact()
            return True
        return False


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


def check_compact_fraction(value) -> float:
    """compact_fraction is a share of the cache's slots: a number in [0, 1] (NaN is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"compact_fraction must be a number in [0, 1] (the share of holes that triggers "
                         f"compaction), got {value!r}")
    return float(value)


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
    return [for_row(i, _validate, model, p, m) for i, (p, m) in enumerate(zip(prompts, budgets))], budgets


def greedy_verify_rows(logits: torch.Tensor, drafts: list):
    """Greedy verification of every row in one call. logits: [B, N, V] with row b's
    ``len(drafts[b]) + 1`` positions right-aligned (left padding); drafts: one list of ids per row.
    Returns ([emitted ids per row], [num_accepted per row])."""
    b, n, v = logits.shape
    lens = torch.tensor([len(d) for d in drafts], device=logits.device)
    k = int(lens.max())
    offs = torch.arange(k + 1, device=logits.device)
    cols = (n - 1 - lens)[:, None] + torch.minimum(offs[None], lens[:, None])  # row b's own offset
    scores = logits.gather(1, cols[:, :, None].expand(b, k + 1, v))
    draft_tokens = torch.full((b, k), -1, dtype=torch.long, device=logits.device)
    for r, d in enumerate(drafts):
        if len(d):
            draft_tokens[r, : len(d)] = torch.as_tensor(d, dtype=torch.long, device=logits.device)
    out, acc = greedy_verify(scores, draft_tokens)
    acc, out = acc.tolist(), out.tolist()
    return [out[r][: acc[r] + 1] for r in range(b)], acc


def _verify_rows(logits: torch.Tensor, drafts: list, sampling: SamplingParams, generators: list):
    """Verify every row's draft against its own slice of the target's logits.

    logits: [B, N, V], row b's ``len(drafts[b]) + 1`` positions right-aligned (left padding).
    Greedy: one ``greedy_verify`` call for the whole batch, drafts padded with -1 (never accepted)
    and each row's scores gathered from its own offset, as vLLM's rejection sampler reads a flat
    batch through per-request offsets. Sampling: one ``rejection_sample`` call per row, since
    each row draws from its own generator exactly as ``generate`` would for that request alone.
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
        out, acc = rejection_sample(probs[None], d.tokens.to(logits.device).long()[None], q, generators[r])
        a = int(acc[0])
        emitted.append(out[0, : a + 1].tolist())
        accepted.append(a)
    return emitted, accepted


def _clip(draft: Draft, limit: int) -> Draft:
    if draft.is_tree:
        raise NotImplementedError("generate_batch verifies chain drafts only; tree drafts run in generate() "
                                  "one request at a time")
    if len(draft) <= limit:
        return draft
    limit = max(limit, 0)
    return Draft(draft.tokens[:limit], None if draft.probs is None else draft.probs[:limit])


@torch.inference_mode()
def generate_batch(model, prompts, proposer: Proposer | None = None, max_new_tokens=128,
                   sampling: SamplingParams | None = None, seed=0, eos_token_id=None,
                   stop_on_eos: bool = True, compact_fraction: float = COMPACT_FRACTION) -> list:
    """Speculative decoding of many requests at once; returns one GenerationResult per prompt, in order.

    prompts: list of 1-D LongTensors [L_i] (different lengths welcome). proposer: what ``generate``
        accepts (None = plain batched decoding); it drafts for all rows through
        ``proposer.batch_proposer()`` (the draft model in one forward per draft position, n-gram
        and other stateless-per-request proposers one copy per row).
    max_new_tokens: int, or one per prompt. sampling: SamplingParams (default greedy), shared.
    seed: int (row i's generator gets ``seed + i``) or a list of one seed per prompt; so row i's
        output equals ``generate(model, prompts[i], proposer, ..., seed=seed + i)``.
    compact_fraction: compact the padded cache when more than this share of it is holes.

    Each result's ``stats`` counts that row's drafts, acceptances and steps; ``target_forwards``
    the batched forwards it took part in; ``wall_time_s`` runs from the start of the batch to the
    row's last token (a row waits for the whole batch at every step).
    """
    sampling = _check_sampling_and_proposer(model, sampling, proposer)
    prompts, budgets = validate_prompts(model, prompts, max_new_tokens)
    seeds = _as_seeds(seed, len(prompts))
    compact_fraction = check_compact_fraction(compact_fraction)
    batch_proposer = None if proposer is None else proposer.batch_proposer()
    eos = set(eos_token_ids(model, eos_token_id)) if stop_on_eos else set()
    window = context_window(model)
    device = next(model.parameters()).device

    rows = []
    for i, (prompt, budget, s) in enumerate(zip(prompts, budgets, seeds)):
        generator = None
        if not sampling.is_greedy:
            generator = torch.Generator(device=device)
            generator.manual_seed(s)
        state = DecodeState(target=model, sampling=sampling, generator=generator, prompt_len=prompt.numel(),
                            token_list=prompt.tolist())
        # Each row's bookkeeping is the single-request engine's (EOS, budget, kinds, SpecStats);
        # the batch proposer, not the row, is told the outcome of each step.
        rows.append(_Request(state, None, budget, eos, window))

    pad = getattr(model.config, "pad_token_id", None)
    target = RaggedCache(model, len(rows), pad_token_id=0 if pad is None else int(pad))
    _sync(device)
    t_start = time.perf_counter()

    # Prefill: all prompts in one forward, left-padded; the last column is every row's last token.
    out = target.forward([r.state.token_list for r in rows], logits_to_keep=1)
    last = out.logits[:, -1]
    prefill_s = target.time_s
    for b, row in enumerate(rows):
        first = int(next_token(last[b], sampling, row.state.generator))
        row.stats.prefill_time_s = prefill_s
        row.stats.target_forwards = 1
        row.stats.target_time_s = prefill_s
        row.append([first], [TARGET])
        row.state.target_cache = None  # the batch's cache is not a single request's cache
    if batch_proposer is not None:
        t0 = time.perf_counter()
        batch_proposer.begin([r.state for r in rows])
        dt = time.perf_counter() - t0
        for row in rows:
            row.stats.draft_time_s += dt
    active = _retire(rows, list(range(len(rows))), target, batch_proposer, t_start, device)

    while active:
        live = [rows[i] for i in active]
        states = [r.state for r in live]
        if batch_proposer is not None:
            t0 = time.perf_counter()
            drafts = batch_proposer.propose(states)
            dt = time.perf_counter() - t0
            if len(drafts) != len(live):
                raise RuntimeError(f"{batch_proposer!r} returned {len(drafts)} drafts for {len(live)} rows")
            for row, d in zip(live, drafts):
                row.stats.draft_time_s += dt
                _check_draft(proposer, d)
        else:
            drafts = [Draft.empty(device) for _ in live]
        # Never draft past a row's token budget or the context window: those could not be emitted.
        drafts = [_clip(d, row.draft_limit()) for row, d in zip(live, drafts)]
        committed_before = [len(r.state.token_list) for r in live]
        t0 = target.time_s
        out = target.forward([[r.state.token_list[-1]] + d.tokens.tolist() for r, d in zip(live, drafts)])
        step_s = target.time_s - t0
        emitted, accepted = _verify_rows(out.logits, drafts, sampling, [r.state.generator for r in live])
        # Each row rolls back to its own committed length (minus the newest token).
        target.rollback([c + a for c, a in zip(committed_before, accepted)])
        outcomes = []
        for row, d, em, a in zip(live, drafts, emitted, accepted):
            n = len(d)
            kinds = [ACCEPTED] * a + [TARGET if n == 0 else (BONUS if a == n else RECOVERED)]
            em = row.append(em, kinds)
            row.stats.record_step(n, a, len(em))
            row.stats.target_forwards += 1
            row.stats.target_time_s += step_s
            outcomes.append(StepOutcome(d, a, em))
        if batch_proposer is not None:
            t0 = time.perf_counter()
            batch_proposer.on_verified(states, outcomes)
            dt = time.perf_counter() - t0
            for row in live:
                row.stats.draft_time_s += dt
        active = _retire(rows, active, target, batch_proposer, t_start, device)
        if active:
            target.maybe_compact(compact_fraction)

    results = []
    for row in rows:
        row.stats.new_tokens = len(row.tokens)
        results.append(GenerationResult(torch.tensor(row.tokens, dtype=torch.long), row.stats, row.kinds, row.finish))
    return results


def _retire(rows, active: list, target: RaggedCache, batch_proposer, t_start: float, device) -> list:
    """Finished rows leave the batch: their cache rows (target and drafter) are dropped."""
    stay = [j for j, i in enumerate(active) if not rows[i].done]
    if len(stay) == len(active):
        return active
    _sync(device)
    now = time.perf_counter() - t_start
    for i in active:
        if rows[i].done and rows[i].stats.wall_time_s == 0.0:
            rows[i].stats.wall_time_s = now
    if stay:
        target.select_rows(stay)
        if batch_proposer is not None:
            batch_proposer.keep_rows(stay)
    return [active[j] for j in stay]
