"""Continuous batching with speculation: requests arrive, join the running batch, draft, verify, leave.

One scheduler step (:meth:`Scheduler.step`), as in vLLM's v1 engine:

1. Arrivals join the waiting queue (FCFS).
2. Draft: one batch drafter (``proposer.batch_proposer()``, rows in the cache's order) drafts for
   every running request, up to K tokens (a tree: K levels), K chosen by the policy (policies.py)
   for this batch size. The drafted ids become ``spec_token_ids``.
3. Schedule (``Scheduler.schedule``, vLLM ``Scheduler.schedule`` in
   ``vllm/v1/core/sched/scheduler.py``): there is no prefill or decode phase, only
   ``num_computed_tokens`` (tokens in the KV cache) catching up with ``num_tokens_with_spec``
   (prompt + output + drafts). Running requests first: each needs ``num_tokens -
   num_computed_tokens`` committed tokens (1 while decoding) plus its drafts, within the step's
   token budget. The drafts are scheduled tokens like the last committed one: their slots are
   reserved with them (``BlockManager.allocate_slots(request, 1 + len(drafts))``, as vLLM does for
   n-gram drafting, where ``num_lookahead_tokens`` is 0) and only the accepted ones stay. vLLM's
   ``num_lookahead_tokens`` reserves slots beyond the scheduled tokens, for drafters that write
   their own KV for the next step's drafts (EAGLE, a draft model; ``VllmConfig.num_lookahead_tokens``). When the block pool cannot hold a request, the most recently admitted
   running request is preempted (recompute-style: its blocks, cache row and drafter row are
   dropped, its output so far kept; it goes back to the front of the waiting queue and is
   prefilled again, prompt + output, when readmitted, its drafter row started afresh from that
   prefill), exactly vLLM's ``_preempt_request`` with ``running.pop()``. Then, if nothing was preempted, waiting requests are admitted while the
   token budget, ``max_num_seqs`` and the block pool allow.
4. Execute: one target forward scores every running request's last committed token plus its
   drafts (``batch.score_and_verify``, the step ``generate_batch`` takes: ragged_cache.RaggedCache
   with per-row positions, per-row tree masks, per-row rollback); the newly admitted requests are
   prefilled in a forward of their own, their cache rows join the batch (``RaggedCache.join``) and
   their drafter rows join the drafter's (``BatchProposer.add_rows``, started from the prefill's
   hidden states for drafters that read them). A padded cache makes one forward cost B x (longest row), so a 300-token
   prompt in the same forward as 16 decoding rows would cost 16 x 300 positions; vLLM's paged
   kernels put both in one forward without padding.
5. Verify each row on its own (greedy or rejection sampling, ``vllm/v1/sample/rejection_sampler.py``),
   roll the row back to its accepted length, give back the blocks only rejected drafts needed
   (``BlockManager.trim``), commit (EOS, max_new_tokens, token kinds: ``request.Request.commit``,
   the same step rule as ``generate`` and ``generate_batch``), and let finished requests free
   their blocks and leave.

The block accounting governs admission and preemption: it is the budget a paged cache of
``num_blocks`` blocks would have. The padded RaggedCache does the compute; :meth:`Scheduler.check`
asserts after every step (``check_every_step=True``) that both agree: each running request holds
exactly ``num_computed_tokens`` positions in the cache and exactly the blocks those need.

Greedy output is lossless whatever the schedule: each request's tokens equal plain greedy decoding
of that request alone (fp32), through joins, preemptions and changing K (tests/serving).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import trees
from ..batch import for_row, prompt_list, row_hidden_states, score_and_verify
from ..proposers.base import Draft, Proposer, StepOutcome
from ..ragged_cache import COMPACT_FRACTION, RaggedCache, check_compact_fraction
from ..request import (Request, Verdict, as_int, check_positive_int, check_sampling_and_proposer, check_seed,
                       clip_draft, drafting, eos_token_ids, validate_prompt)
from ..sampling import SamplingParams
from ..verify import check_verification
from .blocks import DEFAULT_BLOCK_SIZE, BlockManager
from .policies import AlwaysOff, AlwaysOn, SpeculationPolicy

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class ServingRequest:
    """One request in the engine: vLLM's ``Request`` (``vllm/v1/request.py``) with our bookkeeping.

    prompt: 1-D LongTensor [L]. ``row`` is the ``request.Request`` every decoding path keeps (tokens,
    token kinds, EOS, max_new_tokens, SpecStats); its ``state.token_list`` is prompt + output.
    Times are wall-clock seconds since the run started; steps are scheduler steps.
    """

    request_id: int
    prompt: torch.Tensor
    max_new_tokens: int
    arrival_step: int = 0
    row: Request | None = None
    status: str = WAITING
    num_computed_tokens: int = 0  # positions of token_list in the KV cache
    draft: Draft | None = None  # this step's drafted tokens (vLLM's spec_token_ids)
    num_preemptions: int = 0
    arrival_time: float = float("nan")
    first_token_time: float = float("nan")
    finish_time: float = float("nan")
    first_token_step: int = -1
    finish_step: int = -1
    emissions: list = field(default_factory=list)  # (wall time, step, tokens emitted) per step that emitted

    @property
    def token_list(self) -> list:
        return self.row.state.token_list

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens (vLLM ``Request.num_tokens``)."""
        return len(self.row.state.token_list)

    @property
    def spec_token_ids(self) -> list:
        return [] if self.draft is None else self.draft.tokens.tolist()

    @property
    def num_tokens_with_spec(self) -> int:
        """Prompt + output + drafted tokens (vLLM ``Request.num_tokens_with_spec``)."""
        return self.num_tokens + (0 if self.draft is None else len(self.draft))

    @property
    def num_output_tokens(self) -> int:
        return len(self.row.tokens)

    @property
    def output(self) -> list:
        return list(self.row.tokens)

    @property
    def stats(self):
        return self.row.stats

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


@dataclass
class StepRecord:
    """What one step did (for plots and tests)."""

    step: int
    batch_size: int  # running requests that decoded (verified a draft or decoded one token)
    k: int  # the policy's K
    num_prefills: int
    scheduled_tokens: int  # committed + drafted tokens computed this step
    num_preempted: int
    reserved_blocks: int  # blocks in use after scheduling: committed tokens + drafts
    used_blocks: int  # blocks in use after verification: rejected drafts' slots given back
    wall_s: float  # wall time of the step
    draft_s: float = 0.0  # of which drafting (the drafter's propose, on_verified and add_rows)
    decode_s: float = 0.0  # of which the decode forward of the running requests and their verification


@dataclass
class ServingResult:
    """A finished run: every request (in submission order), the step log, the block pool."""

    requests: list
    steps: list
    wall_s: float
    blocks: BlockManager
    policy: SpeculationPolicy

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.requests)

    def outputs(self) -> list:
        return [r.output for r in self.requests]

    def metrics(self) -> dict:
        from .metrics import serving_metrics

        return serving_metrics(self)


def poisson_arrivals(num_requests: int, rate_per_step: float, seed: int = 0) -> list:
    """Arrival steps of a Poisson process with ``rate_per_step`` requests per scheduler step
    (exponential gaps, seeded), rounded down to whole steps; the first request arrives at step 0.
    rate_per_step = inf: all at step 0 (a closed batch)."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests!r}")
    if not rate_per_step > 0:
        raise ValueError(f"rate_per_step must be > 0, got {rate_per_step!r}")
    if np.isinf(rate_per_step):
        return [0] * num_requests
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_step, size=num_requests)
    gaps[0] = 0.0
    return [int(t) for t in np.floor(np.cumsum(gaps))]


class Scheduler:
    """A continuous-batching engine with speculative decoding (see the module docstring).

    model: the target. proposer: any proposer ``generate_batch`` accepts, chains and trees (None =
    no drafting); it drafts for the running requests through ``proposer.batch_proposer()``, whose
    rows follow the cache's (the draft model and early exit in one forward per draft position,
    Medusa, Hydra, EAGLE and n-gram one copy per request, fed that request's hidden states). policy: a SpeculationPolicy (default: always on at the
    proposer's k, or off without a proposer). num_blocks, block_size: the KV block pool.
    max_num_batched_tokens: the per-step token budget (vLLM's ``max_num_batched_tokens``), prompt
    tokens, committed tokens and drafts all counted; it must hold the longest prompt + output
    (prefills are not chunked). max_num_seqs: the most running requests.
    sampling, seed: shared SamplingParams; request i's generator is seeded with seed + i.
    check_every_step: run :meth:`check` after every step (tests). verification: "token" or "block"
    for sampled chain drafts (``generate``'s argument).
    """

    def __init__(self, model, proposer: Proposer | None = None, policy: SpeculationPolicy | None = None, *,
                 num_blocks: int = 256, block_size: int = DEFAULT_BLOCK_SIZE, max_num_batched_tokens: int = 2048,
                 max_num_seqs: int = 16, sampling: SamplingParams | None = None, seed: int = 0,
                 eos_token_id=None, stop_on_eos: bool = True, check_every_step: bool = False,
                 compact_fraction: float = COMPACT_FRACTION, verification: str = "token"):
        self.model = model
        self.sampling = check_sampling_and_proposer(model, sampling, proposer)
        proposer = drafting(proposer)
        # One batch drafter for the whole run, its rows those of the cache (refuses what cannot batch).
        self.drafter = None if proposer is None else proposer.batch_proposer()
        if self.drafter is not None:
            self.drafter.begin([])
        self.want_hidden = self.drafter is not None and self.drafter.needs_hidden_states
        if policy is None:
            policy = AlwaysOff() if proposer is None else AlwaysOn(proposer.k)
        if not isinstance(policy, SpeculationPolicy):
            raise TypeError(f"policy must be a SpeculationPolicy (policies.make_policy builds one from the names "
                            f"'on', 'off', 'adaptive'), got {type(policy).__name__}")
        if proposer is None and not isinstance(policy, AlwaysOff):
            raise ValueError(f"policy {policy!r} drafts, but no proposer was given")
        if proposer is not None and policy.k > proposer.k:
            raise ValueError(f"policy {policy!r} may ask for more drafts than the proposer's k={proposer.k}")
        check_positive_int(max_num_batched_tokens, "max_num_batched_tokens")
        check_positive_int(max_num_seqs, "max_num_seqs")
        compact_fraction = check_compact_fraction(compact_fraction)
        self.verification = check_verification(verification)
        self.proposer, self.policy = proposer, policy
        self.blocks = BlockManager(num_blocks, block_size)
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.seed = check_seed(seed)
        self.eos = set(eos_token_ids(model, eos_token_id)) if stop_on_eos else set()
        self.device = next(model.parameters()).device
        pad = getattr(model.config, "pad_token_id", None)
        self.pad_token_id = 0 if pad is None else int(pad)
        self.check_every_step, self.compact_fraction = check_every_step, compact_fraction

        self.requests: list = []  # every request, in submission order
        self.pending: list = []  # not arrived yet, by arrival step
        self.waiting: deque = deque()  # arrived (or preempted), not running
        self.running: list = []  # scheduling order (admission order)
        self.cache: RaggedCache | None = None  # rows = self.cache_rows, in that order
        self.cache_rows: list = []
        self.step_count = 0
        self._step_draft_s = 0.0
        self._joined: list = []  # requests prefilled this step, not yet given to the drafter
        self.log: list = []
        self._t0: float | None = None

    # --- requests --------------------------------------------------------------------------------

    def add_request(self, prompt, max_new_tokens: int, arrival_step: int = 0) -> ServingRequest:
        """Submit a request (a 1-D LongTensor of prompt ids) arriving at ``arrival_step``."""
        prompt = for_row(len(self.requests), validate_prompt, self.model, prompt, max_new_tokens, what="request")
        arrival_step = for_row(len(self.requests), _check_arrival_step, arrival_step, what="request")
        i = len(self.requests)
        longest = prompt.numel() + max_new_tokens  # a resumed request re-prefills prompt + output
        if longest > self.max_num_batched_tokens:
            raise ValueError(f"request {i}: prompt of {prompt.numel()} tokens + max_new_tokens={max_new_tokens} exceeds the "
                             f"token budget max_num_batched_tokens={self.max_num_batched_tokens} (prefills are "
                             f"not chunked): raise the budget or shorten the request")
        k = 0 if self.proposer is None else self.proposer.k
        if self.blocks.blocks_needed(longest + k) > self.blocks.num_blocks:
            raise ValueError(f"request {i}: a request of {prompt.numel()} + {max_new_tokens} tokens (+{k} drafts) needs "
                             f"{self.blocks.blocks_needed(longest + k)} blocks of {self.blocks.block_size}; the pool "
                             f"has {self.blocks.num_blocks}, so it could never finish")
        # Request i draws with its own generator, seeded seed + i, as generate_batch's row i does.
        req = ServingRequest(i, prompt, max_new_tokens, arrival_step,
                             row=Request.start(self.model, prompt, self.sampling, self.seed + i, max_new_tokens,
                                               self.eos))
        self.requests.append(req)
        self.pending.append(req)
        self.pending.sort(key=lambda r: (r.arrival_step, r.request_id))
        return req

    @property
    def has_unfinished(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self._t0

    def _arrive(self) -> None:
        if not self.running and not self.waiting and self.pending:  # idle: skip to the next arrival
            self.step_count = max(self.step_count, self.pending[0].arrival_step)
        now = self._now()
        while self.pending and self.pending[0].arrival_step <= self.step_count:
            req = self.pending.pop(0)
            req.arrival_time = now
            self.waiting.append(req)

    # --- 2. draft --------------------------------------------------------------------------------

    def _draft(self, k: int) -> None:
        for req in self.running:
            req.draft = None
        if k == 0 or self.drafter is None or not self.cache_rows:
            return
        reqs = self.cache_rows  # the running requests, in the cache's (and the drafter's) row order
        drafts = self._timed(reqs, self.drafter.propose, [r.row.state for r in reqs])
        for j, (req, draft) in enumerate(zip(reqs, drafts)):
            # Never draft past the policy's K (a tree: its depth), the token budget or the context window.
            req.draft = req.row.take_draft(self.drafter.row_proposer(j), draft, limit=k)

    def _timed(self, reqs: list, fn, *args):
        """Call a drafter hook for many requests, charging its time to each one's drafting (and to
        the step's, once)."""
        t0 = time.perf_counter()
        out = fn(*args)
        dt = time.perf_counter() - t0
        self._step_draft_s += dt
        for r in reqs:
            r.row.stats.draft_time_s += dt
        return out

    # --- 3. schedule -----------------------------------------------------------------------------

    def _discard_draft(self, req: ServingRequest) -> None:
        """Drop a draft that will not be scored; the drafter rolls the request's row back as after
        a step that accepted nothing and emitted nothing (``_verified``)."""
        req.draft = None

    def _preempt(self, req: ServingRequest) -> None:
        """Recompute-style preemption (vLLM ``Scheduler._preempt_request``): free the blocks, drop
        the cache row, keep the output; back to the front of the waiting queue."""
        self.blocks.free(req)
        self._drop_rows([req])
        req.num_computed_tokens = 0
        self._discard_draft(req)
        req.status = WAITING
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    def schedule(self):
        """Decide this step's work (vLLM ``Scheduler.schedule``). Returns (decode: {request:
        number of drafts kept}, prefill: [newly admitted requests], preempted: [requests])."""
        budget = self.max_num_batched_tokens
        decode, preempted = {}, []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = req.num_tokens - req.num_computed_tokens  # 1: the last committed token
            if num_new > budget:
                break
            if req.draft is not None and len(req.draft) > budget - num_new:
                req.draft = _clip_to_budget(req.draft, budget - num_new)
            num_spec = 0 if req.draft is None else len(req.draft)
            # vLLM's num_new_tokens = num_tokens_with_spec - num_computed_tokens: the drafts are
            # inside it; num_lookahead_tokens stays 0 (no drafter here writes KV ahead of the target)
            while self.blocks.allocate_slots(req, num_new + num_spec) is None:
                victim = self.running.pop()  # the most recently admitted request
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.status != RUNNING:
                break
            decode[req] = num_spec
            budget -= num_new + num_spec
            i += 1
        prefill = []
        while not preempted and self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            num_new = req.num_tokens - req.num_computed_tokens  # prompt (+ output after a preemption)
            if num_new > budget or self.blocks.allocate_slots(req, num_new) is None:
                break
            self.waiting.popleft()
            req.status = RUNNING
            self.running.append(req)
            prefill.append(req)
            budget -= num_new
        return decode, prefill, preempted

    # --- 4. execute, 5. verify and commit --------------------------------------------------------

    def _drop_rows(self, reqs: list) -> None:
        gone = {id(r) for r in reqs}
        stay = [j for j, r in enumerate(self.cache_rows) if id(r) not in gone]
        if len(stay) == len(self.cache_rows):
            return
        self.cache_rows = [self.cache_rows[j] for j in stay]
        if not stay:
            self.cache = None
        else:
            self.cache.select_rows(stay)
        if self.drafter is not None:
            self.drafter.keep_rows(stay)

    def _join(self, new: RaggedCache, reqs: list) -> None:
        """The prefilled requests' cache rows join the running batch."""
        if self.cache is None:
            self.cache, self.cache_rows = new, list(reqs)
            return
        self.cache.join(new)
        self.cache_rows = self.cache_rows + list(reqs)

    def _commit(self, req: ServingRequest, draft: Draft, verdict: Verdict, step_s: float, now: float) -> StepOutcome:
        """Commit a verification step (or a resumed request's prefill, a step with nothing drafted)."""
        committed_before = req.num_tokens
        outcome = req.row.commit(draft, verdict)
        self.policy.observe(len(draft), verdict.num_accepted)
        self._computed(req, committed_before + verdict.num_accepted, len(outcome.emitted), step_s, now)
        return outcome

    def _commit_first(self, req: ServingRequest, logits: torch.Tensor, step_s: float, now: float) -> None:
        """The prefill's token, as in generate(): drawn from the target alone, no verification step."""
        row = req.row
        committed_before = req.num_tokens
        emitted = row.commit_first(logits)
        row.stats.prefill_time_s += step_s
        req.first_token_time, req.first_token_step = now, self.step_count
        self._computed(req, committed_before, len(emitted), step_s, now)

    def _verified(self, outcomes: dict) -> None:
        """The drafter rolls back every row it holds: a decoded row by its step's outcome, a row
        that scored nothing this step (over the token budget) as after a step that emitted nothing."""
        if self.drafter is None:
            return
        reqs = self.cache_rows[: len(self.cache_rows) - len(self._joined)]
        if not reqs:
            return
        empty = Draft.empty(self.device)
        self._timed(reqs, self.drafter.on_verified, [r.row.state for r in reqs],
                    [outcomes.get(id(r), StepOutcome(empty, 0, [])) for r in reqs])

    def _computed(self, req: ServingRequest, num_computed: int, num_emitted: int, step_s: float, now: float) -> None:
        """After a forward: the request's cache holds every committed token but the last."""
        req.row.stats.target_forwards += 1
        req.row.stats.target_time_s += step_s
        req.emissions.append((now, self.step_count, num_emitted))
        req.num_computed_tokens = num_computed
        req.draft = None

    def _decode(self, decode: dict) -> tuple:
        """One forward over the running rows: the committed tokens not yet in the cache (the last
        one while decoding) and the draft (a chain or a tree) per scheduled row, verified and
        rolled back row by row (batch.score_and_verify, as in generate_batch); a row over the
        token budget feeds nothing. Returns ([(request, draft, verdict)], the forward's seconds)."""
        if not decode:
            return [], 0.0
        empty = Draft.empty(self.device)
        rows = [req.row if req in decode else None for req in self.cache_rows]
        drafts = [req.draft if req.draft is not None else empty for req in self.cache_rows]
        t0 = self.cache.time_s
        verdicts = score_and_verify(self.cache, rows, drafts, self.sampling, self.want_hidden, self.verification)
        step_s = self.cache.time_s - t0
        return [(req, d, v) for req, d, v in zip(self.cache_rows, drafts, verdicts) if v is not None], step_s

    def _prefill(self, reqs: list) -> tuple:
        """The newly admitted requests in one forward of their own (prompt, or prompt + output after
        a preemption); their rows then join the batch. Returns ([(request, its last position's
        logits [V], its hidden states per layer [n, H] or None)], the forward's seconds)."""
        if not reqs:
            return [], 0.0
        new = RaggedCache(self.model, len(reqs), pad_token_id=self.pad_token_id)
        fed = [r.token_list[r.num_computed_tokens:] for r in reqs]
        out = new.forward(fed, logits_to_keep=1, output_hidden_states=self.want_hidden)
        self._join(new, reqs)
        hidden = [row_hidden_states(out.hidden_states, b, len(ids)) if self.want_hidden else None
                  for b, ids in enumerate(fed)]
        return [(r, out.logits[b, -1], h) for b, (r, h) in enumerate(zip(reqs, hidden))], new.time_s

    def step(self) -> StepRecord:
        """Arrivals, draft, schedule, execute, verify, commit, retire: one engine iteration."""
        if self._t0 is None:
            self._t0 = time.perf_counter()
        t_start = self._now()
        self._step_draft_s = 0.0
        self._arrive()
        k = self.policy.choose_k(len(self.running)) if self.running else 0
        self._draft(k)
        decode, prefill, preempted = self.schedule()
        reserved = self.blocks.num_used_blocks
        for req in self.running:  # a request over the token budget scores no draft this step
            if req not in decode:
                self._discard_draft(req)
        scheduled = sum(1 + n for n in decode.values()) + sum(r.num_tokens - r.num_computed_tokens for r in prefill)
        decoded, decode_s = self._decode(decode)
        prefilled, prefill_s = self._prefill(prefill)
        self._joined = [r for r, *_ in prefilled]
        now = self._now()
        outcomes = {id(r): self._commit(r, draft, verdict, decode_s, now) for r, draft, verdict in decoded}
        self._verified(outcomes)
        for r, logits, hidden in prefilled:
            if r.num_output_tokens == 0:
                self._commit_first(r, logits, prefill_s, now)
            else:  # resumed after a preemption: its prefill's token is a plain step's
                self._commit(r, Draft.empty(self.device), Verdict([r.row.draw(logits)], 0, True), prefill_s, now)
            r.row.state.prompt_hidden_states = hidden  # what the drafter starts from (drafters that read it)
        if self.drafter is not None and prefilled:
            # The newly admitted (or resumed) requests start drafting from everything committed.
            self._timed(self._joined, self.drafter.add_rows, [r.row.state for r in self._joined])
        for r in self._joined:
            r.row.state.prompt_hidden_states = None  # read once, by add_rows
        self._joined = []
        for r, *_ in decoded + prefilled:
            self.blocks.trim(r)  # give back the slots only rejected drafts needed
        if decoded:  # the decode part of the step, drafting included: what the policy's K cost
            emitted = sum(len(verdict.emitted) for _, _, verdict in decoded)
            self.policy.observe_step(len(decoded), k, emitted, now - t_start - prefill_s)
        self._retire(now)
        if self.cache is not None:
            self.cache.maybe_compact(self.compact_fraction)
        record = StepRecord(self.step_count, len(decode), k, len(prefill), scheduled, len(preempted),
                            reserved, self.blocks.num_used_blocks, now - t_start, self._step_draft_s, decode_s)
        self.log.append(record)
        if self.check_every_step:
            self.check()
        self.step_count += 1
        return record

    def _retire(self, now: float) -> None:
        done = [r for r in self.running if r.row.done]
        if not done:
            return
        for r in done:
            self.blocks.free(r)
            r.status, r.finish_time, r.finish_step = FINISHED, now, self.step_count
            r.row.stats.new_tokens = len(r.row.tokens)
            r.row.stats.wall_time_s = now - r.arrival_time
        self._drop_rows(done)
        self.running = [r for r in self.running if not r.row.done]

    def check(self) -> None:
        """Assert that blocks, cache and queues agree (AssertionError otherwise): every running
        request owns exactly the blocks its computed tokens need and holds exactly those positions
        in the cache; nobody else owns a block; every request is in exactly one place."""
        self.blocks.check({r.request_id: r.num_computed_tokens for r in self.running})
        assert [id(r) for r in self.cache_rows] == [id(r) for r in self.running], \
            "the cache's rows are not the running requests"
        if self.cache is not None:
            got = list(self.cache.lengths)
            want = [r.num_computed_tokens for r in self.cache_rows]
            assert got == want, f"cache lengths {got} != computed tokens {want}"
            live = (self.cache.slot_pos >= 0).sum(1).tolist()
            assert live == want, f"live cache slots {live} != computed tokens {want}"
        places = [id(r) for r in self.pending] + [id(r) for r in self.waiting] + [id(r) for r in self.running]
        assert len(places) == len(set(places)), "a request is in two queues"
        unfinished = {id(r) for r in self.requests if r.status != FINISHED}
        assert set(places) == unfinished, "a request is lost (in no queue and not finished)"

    def run(self, max_steps: int | None = None) -> ServingResult:
        """Step until every submitted request has finished (or ``max_steps`` steps)."""
        self._t0 = time.perf_counter() if self._t0 is None else self._t0
        start = self._now()
        with torch.inference_mode():
            while self.has_unfinished:
                if max_steps is not None and len(self.log) >= max_steps:
                    break
                self.step()
        return ServingResult(list(self.requests), list(self.log), self._now() - start, self.blocks, self.policy)


def _clip_to_budget(draft: Draft, budget: int) -> Draft:
    """``draft`` cut to ``budget`` scheduled tokens: a chain's first ones, a tree's first nodes
    (node order is topological, so the first nodes are still a tree)."""
    if not draft.is_tree:
        return clip_draft(draft, budget)
    parents, keep = trees.clip_tree(draft.parents, max_nodes=max(budget, 0))
    probs = None if draft.probs is None else draft.probs[keep.to(draft.probs.device)]
    return Draft(draft.tokens[keep.to(draft.tokens.device)], probs, parents)


def _check_arrival_step(value) -> int:
    """A step number: an int >= 0 (numpy ints welcome); a float is refused, not rounded down."""
    step = as_int(value)
    if step is None or step < 0:
        raise ValueError(f"arrival_step must be an int >= 0, got {value!r}")
    return step


def serve(model, prompts, proposer: Proposer | None = None, policy: SpeculationPolicy | None = None,
          max_new_tokens=128, arrival_steps=None, **config) -> ServingResult:
    """Run a list of prompts (1-D LongTensors) through a :class:`Scheduler`; arrival_steps: one per
    prompt (default: all at step 0); max_new_tokens: int or one per prompt; config: Scheduler's
    keyword arguments."""
    prompts = prompt_list(prompts, "serve")
    budgets = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
    arrivals = [0] * len(prompts) if arrival_steps is None else list(arrival_steps)
    if len(budgets) != len(prompts) or len(arrivals) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(budgets)} max_new_tokens and {len(arrivals)} arrival steps")
    sched = Scheduler(model, proposer, policy, **config)
    for p, m, a in zip(prompts, budgets, arrivals):
        sched.add_request(p, m, a)  # add_request checks the step (a float is refused, not rounded)
    return sched.run()
