"""The serving scheduler: continuous batching with speculation, block accounting, preemption, policies.

Greedy (fp32): every request's output equals plain greedy decoding of that request alone, through
Poisson arrivals, joins, recompute preemptions and a KV pool too small for the load, while the
block pool, the cache and the queues agree after every step (Scheduler.check). Planted bugs
(rejected-draft slots never given back, a preempted request keeping its blocks, a row not rolled
back) are each caught. Policies: off never drafts, on always does, adaptive turns drafting off at
a large batch when acceptance is low (the cost model, no timing).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode_ref import autoregressive_generate, chat_ids
from specdecode_ref.analysis import estimate_alpha
from specdecode_ref.proposers import Draft, NgramProposer, Proposer
from specdecode_ref.serving import scheduler as sched_mod
from specdecode_ref.serving.blocks import BlockManager
from specdecode_ref.serving.metrics import serving_metrics
from specdecode_ref.serving.policies import AdaptivePolicy, AlwaysOff, AlwaysOn, roofline_cost
from specdecode_ref.serving.scheduler import Scheduler, poisson_arrivals, serve
from specdecode_ref.serving.sweep import run_sweep
from specdecode_ref.serving.vllm_runner import ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS


VOCAB = 64
EOS = 7  # some requests stop early at this token


class AlwaysDrafts(Proposer):
    """Drafts k tokens every step (a counting pattern the random model rarely accepts)."""

    def propose(self, state):
        last = state.token_list[-1]
        return Draft(torch.tensor([(last + 1 + i) % VOCAB for i in range(self.k)], dtype=torch.long))


def _workload(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(2, 24, (1,), generator=g)),), generator=g) for _ in range(n)]
    budgets = [int(torch.randint(1, 24, (1,), generator=g)) for _ in range(n)]
    return prompts, budgets


@pytest.fixture(scope="module")
def load(tiny_model):
    """Two hundred requests, their Poisson arrivals and each one's plain greedy output alone."""
    prompts, budgets = _workload(200)
    arrivals = poisson_arrivals(len(prompts), rate_per_step=0.6, seed=1)
    refs = [autoregressive_generate(tiny_model, p, max_new_tokens=m, eos_token_id=EOS).tokens.tolist()
            for p, m in zip(prompts, budgets)]
    return prompts, budgets, arrivals, refs


def _scheduler(model, proposer=None, policy=None, **kw):
    config = dict(num_blocks=20, block_size=4, max_num_batched_tokens=64, max_num_seqs=8, eos_token_id=EOS,
                  check_every_step=True)
    config.update(kw)
    return Scheduler(model, proposer, policy, **config)


def _run(sched, prompts, budgets, arrivals):
    for p, m, a in zip(prompts, budgets, arrivals):
        sched.add_request(p, m, a)
    return sched.run()


# --- (a) many requests, a small KV pool: lossless, no leak, preemption happens -----------------

@pytest.mark.parametrize("policy", ["off", "on", "adaptive"])
def test_poisson_load_with_preemption_is_lossless(tiny_model, load, policy):
    prompts, budgets, arrivals, refs = load
    proposer = NgramProposer(k=4)
    pol = {"off": AlwaysOff(), "on": AlwaysOn(4), "adaptive": AdaptivePolicy(4, cost=roofline_cost(12))}[policy]
    sched = _scheduler(tiny_model, None if policy == "off" else proposer, pol)
    result = _run(sched, prompts, budgets, arrivals)  # check() after every step
    assert result.num_preemptions > 0, "the pool should be too small for the load"
    assert sched.blocks.num_free_blocks == sched.blocks.num_blocks and not sched.blocks.tables
    sched.blocks.check({})
    bad = [i for i, (r, ref) in enumerate(zip(result.requests, refs)) if r.output != ref]
    assert not bad, f"requests {bad[:5]} differ from plain greedy decoding alone"
    assert any(r.row.finish == "eos" for r in result.requests)
    m = serving_metrics(result)
    assert m["output_tokens"] == sum(len(r) for r in refs)
    if policy == "on":
        assert m[DRAFTS.removeprefix("vllm:")] > 0 and m["spec_decode_num_accepted_tokens"] > 0


def test_draft_slots_are_reserved_then_given_back(tiny_model):
    """Drafts are scheduled tokens, as vLLM schedules n-gram drafts: a decoding request's
    num_new_tokens is 1 + its drafts (num_tokens_with_spec - num_computed_tokens), and
    num_lookahead_tokens, vLLM's extra room for drafters that write KV ahead, stays 0."""
    prompts, budgets = _workload(6, seed=3)
    sched = _scheduler(tiny_model, AlwaysDrafts(4), AlwaysOn(4), num_blocks=64)
    decode_new, lookahead = [], []
    real = sched.blocks.allocate_slots

    def spy(request, num_new_tokens, num_lookahead_tokens=0):
        if request.num_computed_tokens > 0:  # a decoding request (a prefill starts from 0)
            decode_new.append(num_new_tokens)
        lookahead.append(num_lookahead_tokens)
        return real(request, num_new_tokens, num_lookahead_tokens)

    sched.blocks.allocate_slots = spy
    _run(sched, prompts, budgets, [0] * len(prompts))
    assert max(decode_new) == 1 + 4 and set(lookahead) == {0}


def test_per_request_tpot_in_submission_order(tiny_model):
    """serving_metrics gives one TPOT per request, in the order they were added (the paired values
    a notebook compares prompt by prompt); their mean is tpot_mean_s."""
    prompts, budgets = _workload(5, seed=4)
    sched = _scheduler(tiny_model, NgramProposer(k=4), AlwaysOn(4), num_blocks=64)
    result = _run(sched, prompts, budgets, [0] * len(prompts))
    m = serving_metrics(result)
    per = m["tpot_per_request_s"]
    assert len(per) == len(prompts)
    for r, t in zip(result.requests, per):
        if r.num_output_tokens > 1:
            assert t == pytest.approx((r.emissions[-1][0] - r.first_token_time) / (r.num_output_tokens - 1))
    finite = [t for t in per if t == t]
    assert m["tpot_mean_s"] == pytest.approx(sum(finite) / len(finite))
    reached, accepted = m["reached_per_pos"], m["spec_decode_num_accepted_tokens_per_pos"]
    assert len(reached) == len(accepted) and all(a <= r for a, r in zip(accepted, reached))


@pytest.mark.parametrize("wrapper", ["fixed", "heuristic", "goodput", "heuristic(draft)"])
def test_adaptive_k_wrappers_are_lossless_when_served(tiny_model, load, wrapper):
    """The K controllers of proposers/adaptive.py around the proposer each request drafts with
    (n-gram, and a draft model of the target's first layer): served with preemption, every request
    still equals plain decoding alone."""
    from specdecode_ref.proposers.adaptive import FixedK, GoodputK, HeuristicK
    from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model

    prompts, budgets, arrivals, refs = (x[:60] for x in load)
    proposer = {"fixed": lambda: FixedK(NgramProposer(k=4)), "heuristic": lambda: HeuristicK(NgramProposer(k=4)),
                "goodput": lambda: GoodputK(NgramProposer(k=4), verify_cost=lambda k: 1 + 0.05 * k, c_step=0.01,
                                            k_max=6),
                "heuristic(draft)": lambda: HeuristicK(DraftModelProposer(build_draft_model(tiny_model, (1,)), k=4),
                                                       k_max=4)}[wrapper]()
    result = _run(_scheduler(tiny_model, proposer, AlwaysOn(proposer.k)), prompts, budgets, arrivals)
    assert [r.output for r in result.requests] == refs
    assert result.num_preemptions > 0 and result.metrics()["spec_decode_num_draft_tokens"] > 0


# --- (b) the embedded model with n-gram speculation ------------------------------------------

@pytest.mark.embedded
def test_embedded_model_ngram_serving_is_lossless(embedded):
    from specdecode_ref.measure.harness.workloads import load_workloads

    model, tok = embedded
    wl = load_workloads(["qa", "math"], per_category=2)  # short prompts: 45-85 tokens
    prompts = [chat_ids(tok, item["messages"]) for items in wl.values() for item in items]
    prompts.append(chat_ids(tok, "Repeat exactly: one two three, one two three, one two three."))
    budgets = [16, 12, 16, 14, 16]
    refs = [autoregressive_generate(model, p, max_new_tokens=m).tokens.tolist() for p, m in zip(prompts, budgets)]
    # 18 blocks of 8 slots: two or three requests fit, then their growth forces a preemption.
    result = serve(model, prompts, NgramProposer(k=4), AlwaysOn(4), max_new_tokens=budgets,
                   arrival_steps=[0, 0, 1, 2, 3], num_blocks=18, block_size=8,
                   max_num_batched_tokens=512, max_num_seqs=4, check_every_step=True)
    assert [r.output for r in result.requests] == refs
    m = result.metrics()
    assert m["spec_decode_num_accepted_tokens"] > 0 and m["preemptions"] > 0


# --- (c) policies --------------------------------------------------------------------------

def test_off_never_drafts_and_on_always_drafts(tiny_model):
    prompts, budgets = _workload(12, seed=5)
    arrivals = poisson_arrivals(len(prompts), 1.0, seed=0)
    off = _run(_scheduler(tiny_model, AlwaysDrafts(3), AlwaysOff()), prompts, budgets, arrivals)
    assert sum(r.stats.drafted for r in off.requests) == 0 and all(s.k == 0 for s in off.steps)
    on = _run(_scheduler(tiny_model, AlwaysDrafts(3), AlwaysOn(3), num_blocks=64),
              prompts, budgets, arrivals)
    for r in on.requests:  # every verification step drafted, as far as the token budget allowed
        limits = [min(3, r.max_new_tokens - 1 - i) for i in _outputs_before_each_step(r)]
        assert r.stats.draft_lengths == limits
    m = on.metrics()
    assert m[DRAFT_TOKENS.removeprefix("vllm:")] == sum(r.stats.drafted for r in on.requests)
    assert m[ACCEPTED_TOKENS.removeprefix("vllm:")] == sum(r.stats.accepted for r in on.requests)
    # each step's drafting and decode forward are parts of its wall time; off never drafts
    assert all(0 <= s.draft_s + s.decode_s <= s.wall_s for s in on.steps + off.steps)
    assert m["draft_s_per_decode_step"] > 0
    assert 0 < m["decode_s_per_decode_step"] and m["decode_steps"] <= m["steps"]


def _outputs_before_each_step(r):
    """Output tokens a request held before each of its verification steps (no preemption here)."""
    counts, held = [], 0
    for _, _, n in r.emissions:
        if held:
            counts.append(held)
        held += n
    return counts


def test_adaptive_turns_speculation_off_at_large_batch_when_acceptance_is_low():
    cost = roofline_cost(knee_tokens=16)
    low = AdaptivePolicy(4, cost=cost, prior_weight=1.0, probe_every=0)
    for _ in range(50):  # per three steps: one accepted draft, three first-position rejections
        low.observe(4, 0)
        low.observe(4, 0)
        low.observe(4, 1)
    assert 0.2 < low.alpha < 0.3
    assert low.choose_k(1) > 0  # one request: the forward is memory-bound, drafting is free
    assert low.choose_k(64) == 0  # a full batch: every rejected draft costs compute
    high = AdaptivePolicy(4, cost=cost, prior_weight=1.0, probe_every=0)
    for _ in range(50):
        high.observe(4, 4)
    assert high.choose_k(12) > 0 and low.choose_k(12) == 0  # at a medium batch acceptance decides
    assert high.choose_k(1) == 4


def test_adaptive_alpha_counts_tested_positions_not_drafted_tokens():
    """Drafts after the first rejection are never tested: alpha is accepted / (accepted + rejections),
    the i.i.d. maximum-likelihood estimate of analysis.estimate_alpha, not accepted / drafted."""
    rng = np.random.default_rng(0)
    accepted_lengths, draft_lengths = [], []
    pol = AdaptivePolicy(4, cost=roofline_cost(16), prior_weight=1e-9, decay=1.0, probe_every=0)
    for _ in range(4000):  # i.i.d. acceptance at alpha = 0.8, K = 4
        n = 0
        while n < 4 and rng.random() < 0.8:
            n += 1
        pol.observe(4, n)
        accepted_lengths.append(n)
        draft_lengths.append(4)
    assert pol.alpha == pytest.approx(estimate_alpha(accepted_lengths, draft_lengths), rel=1e-6)
    assert abs(pol.alpha - 0.8) < 0.02
    assert sum(accepted_lengths) / sum(draft_lengths) < 0.65  # accepted / drafted would say ~0.59


def test_adaptive_probes_when_off_and_recovers():
    pol = AdaptivePolicy(4, cost=roofline_cost(16), prior_weight=1.0, probe_every=5, decay=0.5)
    for _ in range(20):
        pol.observe(4, 0)
    ks = [pol.choose_k(12) for _ in range(10)]
    assert ks.count(1) == 2 and set(ks) == {0, 1}  # a one-token probe every 5 steps
    for _ in range(20):
        pol.observe(1, 1)
    assert pol.choose_k(12) > 0


def _simulate(pol, batch_size, steps, seconds_per_step, tokens_per_request):
    """A stand-in engine: at each step the policy picks K, the step takes ``seconds_per_step(K)``
    and each request emits ``tokens_per_request(K)`` tokens (K - 1 of them accepted drafts)."""
    ks = []
    for _ in range(steps):
        k = pol.choose_k(batch_size)
        tokens = tokens_per_request(k)
        pol.observe_step(batch_size, k, batch_size * tokens, seconds_per_step(k))
        for _ in range(batch_size):
            pol.observe(k, tokens - 1)
        ks.append(k)
    return ks


def test_adaptive_measured_step_times_veto_speculation_the_model_overrates():
    # The model (a forward that is free to widen) says speculate; the measured steps say each
    # draft costs 30 % of a step while adding 0.2 tokens: plain decoding has the better goodput.
    def make():
        return AdaptivePolicy(4, cost=lambda b, n: 1.0, prior_alpha=0.2, prior_weight=1e6, probe_every=10)

    def seconds(k):
        return 1.0 + 0.3 * k

    def tokens(k):
        return 1 + min(k, 1) * 0.2 * k

    pol = make()
    assert pol.best_k(8) > 0  # the forward-time model alone would speculate
    ks = _simulate(pol, 8, 60, seconds, tokens)
    assert ks[:4] == [4, 4, 0, 0]  # the model's K (here the largest) and K = 0 measured twice each first
    late = ks[20:]
    assert late.count(0) >= 0.8 * len(late)  # then mostly off, a probe now and then
    blind = AdaptivePolicy(4, cost=lambda b, n: 1.0, prior_alpha=0.2, prior_weight=1e6, measure_steps=False)
    assert 0 not in _simulate(blind, 8, 60, seconds, tokens)  # the model alone keeps paying for drafts


def test_adaptive_measured_step_times_pick_the_larger_k_when_it_pays():
    # The model (a compute-bound forward) prefers a short draft; measured, K = 4 emits the most per second.
    pol = AdaptivePolicy(4, cost=roofline_cost(knee_tokens=8), prior_alpha=0.6, prior_weight=1e6, probe_every=0)
    assert 0 < pol.best_k(4) < 4
    ks = _simulate(pol, 4, 40, lambda k: 1.0 + 0.02 * k, lambda k: 1 + 0.6 * k)
    assert ks[-10:] == [4] * 10


def test_adaptive_pools_step_times_per_batch_bucket():
    from specdecode_ref.serving.policies import batch_bucket

    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]
    pol = AdaptivePolicy(2, cost=lambda b, n: 1.0, prior_alpha=0.5, prior_weight=1e6, token_prior_steps=0)
    for _ in range(3):
        pol.observe_step(5, 2, 10, 1.0)
    assert pol.measured_goodput(8, 2) == pytest.approx(2.0) and pol.measured_goodput(4, 2) is None
    # With a prior, the measured 2 tokens per step are pulled towards the model's 1.75 (alpha 0.5, K 2).
    shrunk = AdaptivePolicy(2, cost=lambda b, n: 1.0, prior_alpha=0.5, prior_weight=1e6, token_prior_steps=4)
    shrunk.observe_step(5, 2, 10, 1.0)
    assert shrunk.tokens_per_step(2) == pytest.approx((2.0 + 4 * 1.75) / 5) and shrunk.tokens_per_step(0) == 1.0
    with pytest.raises(ValueError, match="min_samples"):
        AdaptivePolicy(2, min_samples=0)


def test_adaptive_borrows_the_nearest_measured_bucket_then_measures_its_own():
    pol = AdaptivePolicy(4, cost=lambda b, n: 1.0, prior_alpha=0.2, prior_weight=1e6, reprobe_every=6)
    ks8 = _simulate(pol, 8, 10, lambda k: 1.0 + 0.3 * k, lambda k: 1 + 0.2 * k)
    assert ks8[:4] == [4, 4, 0, 0] and ks8[4:8] == [0] * 4  # measured at batch 8: off wins
    ks3 = _simulate(pol, 3, 12, lambda k: 1.0 + 0.01 * k, lambda k: 1 + 0.2 * k)
    # Batch 3 (bucket 4): batch 8's verdict for 6 steps (which measures K = 0 here), then K = 4
    # measured here too: drafts are nearly free at this batch, so from then on it speculates.
    assert ks3[:6] == [0] * 6 and ks3[6:] == [4] * 6


def test_adaptive_in_the_scheduler_stops_drafting_rejected_drafts_at_batch(tiny_model):
    prompts, budgets = _workload(24, seed=7)
    budgets = [20] * len(prompts)
    pol = AdaptivePolicy(3, cost=roofline_cost(knee_tokens=4), prior_alpha=0.5, prior_weight=2.0, probe_every=0)
    result = _run(_scheduler(tiny_model, AlwaysDrafts(3), pol, num_blocks=200, max_num_seqs=8),
                  prompts, budgets, [0] * len(prompts))
    late = [s for s in result.steps if s.batch_size >= 4][-10:]
    assert late and all(s.k == 0 for s in late)  # random drafts are rejected: off at batch 4+
    assert any(s.k > 0 for s in result.steps)  # it did try


# --- (d) planted bugs are caught ---------------------------------------------------------------

def test_planted_bug_rejected_draft_slots_not_given_back(tiny_model, load, monkeypatch):
    prompts, budgets, arrivals, _ = load
    monkeypatch.setattr(BlockManager, "trim", lambda self, request, num_tokens=None: [])
    with pytest.raises(AssertionError, match="owns"):
        _run(_scheduler(tiny_model, NgramProposer(k=4), AlwaysOn(4)), prompts[:40], budgets[:40], arrivals[:40])


def test_planted_bug_preempted_request_keeps_its_blocks(tiny_model, load, monkeypatch):
    prompts, budgets, arrivals, _ = load
    real = Scheduler._preempt

    def leaky(self, req):
        real(self, req)
        self.blocks.tables[req.request_id] = [self.blocks._free.pop()]  # "forgot" to give one back
        self.blocks._owner[self.blocks.tables[req.request_id][0]] = req.request_id

    monkeypatch.setattr(Scheduler, "_preempt", leaky)
    with pytest.raises(AssertionError, match="own"):
        _run(_scheduler(tiny_model, NgramProposer(k=4), AlwaysOn(4)), prompts[:60], budgets[:60], arrivals[:60])


def test_planted_bug_row_not_rolled_back(tiny_model, load, monkeypatch):
    prompts, budgets, arrivals, _ = load
    monkeypatch.setattr(sched_mod.RaggedCache, "rollback", lambda self, keep: None)
    with pytest.raises(AssertionError, match="cache lengths|live cache slots"):
        _run(_scheduler(tiny_model, AlwaysDrafts(3), AlwaysOn(3)), prompts[:20], budgets[:20],
             arrivals[:20])


# --- errors and the sweep ------------------------------------------------------------------

def test_clear_errors(tiny_model):
    with pytest.raises(ValueError, match="could never finish"):
        Scheduler(tiny_model, num_blocks=2, block_size=4).add_request(torch.arange(10), 10)
    with pytest.raises(ValueError, match="token budget"):
        Scheduler(tiny_model, max_num_batched_tokens=8).add_request(torch.arange(10), 10)
    with pytest.raises(ValueError, match="no proposer"):
        Scheduler(tiny_model, None, AlwaysOn(2))
    with pytest.raises(ValueError, match="more drafts"):
        Scheduler(tiny_model, NgramProposer(k=2), AlwaysOn(4))


def test_sweep_table(tiny_model):
    prompts, _ = _workload(6, seed=9)
    df = run_sweep(tiny_model, prompts, loads=(1, 4), k=3, max_new_tokens=8, warmup=False, num_blocks=64,
                   block_size=4)
    assert set(df.policy) == {"off", "on", "adaptive"} and set(df.load) == {1, 4}
    assert df.same_as_off.all()
    for col in ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "acceptance_rate",
                "spec_decode_num_drafts", "spec_decode_num_accepted_tokens_per_pos"):
        assert col in df.columns
    assert (df[df.policy == "off"].spec_decode_num_draft_tokens == 0).all()
    assert "outputs" not in df.columns


def test_sweep_keeps_outputs_for_another_engine(tiny_model):
    prompts, _ = _workload(3, seed=9)
    df = run_sweep(tiny_model, prompts, loads=(2,), policies=("off", "on"), k=3, max_new_tokens=6, warmup=False,
                   num_blocks=64, block_size=4, keep_outputs=True)
    for outputs in df.outputs:
        assert len(outputs) == 3 and all(0 < len(o) <= 6 for o in outputs)
    assert df.outputs.iloc[0] == df.outputs.iloc[1]  # fp32 greedy: on equals off token for token


# --- (e) sampling: each request draws what generate draws with its seed, and the target's law ------

@pytest.fixture(scope="module")
def small_vocab():
    from support import make_tiny_llama

    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2)


def _sampled_proposers(model):
    from support import RandomDraftProposer, noisy
    from specdecode_ref.proposers.adaptive import HeuristicK
    from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model

    draft = noisy(build_draft_model(model, (1,)), 0.5, 0)
    return {"ngram": lambda: NgramProposer(k=4),
            "draft": lambda: DraftModelProposer(draft, k=3),
            "random_q": lambda: RandomDraftProposer(3, VOCAB),
            # k_max = the policy's K: generate would otherwise let the wrapper draft more than the
            # scheduler's AlwaysOn(3) schedules, and the draws would differ (not the law).
            "heuristic(draft)": lambda: HeuristicK(DraftModelProposer(draft, k=3), k_max=3)}


@pytest.mark.parametrize("name", ["ngram", "draft", "random_q", "heuristic(draft)"])
def test_sampled_requests_equal_generate_with_their_seed(tiny_model, name):
    """Request i is seeded seed + i: with joins, a token budget that leaves requests waiting and
    drafts of every acceptance length, each request's output equals ``generate`` with that seed
    (q-sampled drafts included). No preemption here: a recompute preemption draws the next token
    in the re-prefill where generate draws it in a verification step (same law, other draws; the
    joint-law test below runs with preemptions)."""
    from specdecode_ref import SamplingParams, generate

    make = _sampled_proposers(tiny_model)[name]
    s = SamplingParams(temperature=0.8, top_k=20)
    prompts, budgets = _workload(16, seed=11)
    arrivals = poisson_arrivals(len(prompts), rate_per_step=0.6, seed=2)
    proposer = make()
    sched = _scheduler(tiny_model, proposer, AlwaysOn(proposer.k), num_blocks=400, max_num_seqs=4, sampling=s,
                       seed=5)
    result = _run(sched, prompts, budgets, arrivals)
    assert result.num_preemptions == 0
    for i, r in enumerate(result.requests):
        alone = generate(tiny_model, prompts[i], proposer=make(), max_new_tokens=budgets[i], sampling=s, seed=5 + i,
                         eos_token_id=EOS)
        assert r.output == alone.tokens.tolist(), f"request {i} differs from generate(seed={5 + i})"
    lengths = {a for r in result.requests for a in r.row.stats.accepted_lengths}
    assert name == "ngram" or {0, 1} <= lengths, lengths


def _served_joint_counts(model, prompt, make, sampling, n, steps=3, extra=0, **config):
    """n requests of one prompt (request i seeded i) served with a block pool too small for them all:
    32 running requests fill 2 blocks each at admission and need a third when they grow, in a pool
    of 80, so the newest are preempted and recomputed."""
    proposer = make()
    result = serve(model, [prompt] * n, proposer, AlwaysOn(proposer.k), max_new_tokens=steps + extra,
                   sampling=sampling,
                   seed=0, num_blocks=80, block_size=4, max_num_batched_tokens=1024, max_num_seqs=32, **config)
    counts = np.zeros(model.config.vocab_size ** steps)
    for r in result.requests:
        counts[np.ravel_multi_index(r.output[:steps], (model.config.vocab_size,) * steps)] += 1
    return counts, result


@pytest.mark.parametrize("bug", [None, "resample_from_p", "always_accept"],
                         ids=["correct", "planted-resample_from_p", "planted-always_accept"])
def test_sampled_serving_follows_target_joint(small_vocab, bug, monkeypatch):
    """The joint law of each request's three tokens (chi-square against tests/support.exact_joint,
    whose temperature comes from the test's own reference), through joins and preemptions, with a
    drafter that samples its own q; each planted twin (tests/support.plant: the scheduler verifies
    through the batch engine's rejection_sample) fails at the same size."""
    from support import RandomDraftProposer, assert_law, chi2_pvalue, exact_joint, plant
    from specdecode_ref import SamplingParams, generate

    plant(monkeypatch, bug)
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    s = SamplingParams(temperature=0.8)
    make = lambda: RandomDraftProposer(3, 6)  # noqa: E731
    counts, result = _served_joint_counts(small_vocab, prompt, make, s, n=2000)
    if bug is None:
        assert result.num_preemptions > 0
        alone = [i for i, r in enumerate(result.requests) if r.num_preemptions == 0]
        for i in (alone[0], alone[-1]):
            ref = generate(small_vocab, prompt, proposer=make(), max_new_tokens=3, sampling=s, seed=i)
            assert result.requests[i].output == ref.tokens.tolist(), f"request {i}"
    assert_law(chi2_pvalue(counts, exact_joint(small_vocab, prompt, 3, s)), bug)


@pytest.mark.parametrize("bug", [None, "stop_at_weight"], ids=["correct", "planted-stop_at_weight"])
def test_sampled_serving_with_block_verification_follows_target_joint(small_vocab, bug, monkeypatch):
    """The same served joint law with block verification (verify.block_verify), preemptions
    included; its planted twin (a prefix kept with probability w_i, without the residual's share) fails."""
    import specdecode_ref.verify as verify
    from support import BLOCK_TWINS, RandomDraftProposer, assert_law, chi2_pvalue, exact_joint
    from specdecode_ref import SamplingParams, generate

    if bug is not None:
        monkeypatch.setattr(verify, *BLOCK_TWINS[bug])
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    s = SamplingParams(temperature=0.8)
    make = lambda: RandomDraftProposer(3, 6)  # noqa: E731
    # Three tokens more than counted, so the first verification step judges a whole block of three.
    counts, result = _served_joint_counts(small_vocab, prompt, make, s, n=2000, extra=3, verification="block",
                                          stop_on_eos=False)
    if bug is None:
        assert result.num_preemptions > 0
        i = next(i for i, r in enumerate(result.requests) if r.num_preemptions == 0)
        ref = generate(small_vocab, prompt, proposer=make(), max_new_tokens=6, sampling=s, seed=i, stop_on_eos=False,
                       verification="block")
        assert result.requests[i].output == ref.tokens.tolist()
    assert_law(chi2_pvalue(counts, exact_joint(small_vocab, prompt, 3, s)), bug)


class NgramBesideCountingTree(Proposer):
    """A tree draft: the n-gram lookup's chain, and beside it from the root a counting chain (rarely
    right). The accepted path runs down the first branch, and the second branch, at the same
    positions, must be discarded from the cache."""

    def __init__(self, k: int = 3):
        super().__init__(2 * k)
        self.ngram = NgramProposer(k=k)

    def begin(self, state):
        self.ngram.begin(state)

    def propose(self, state):
        a = self.ngram.propose(state).tokens.tolist()
        last = state.token_list[-1]
        b = [(last + 1 + i) % VOCAB for i in range(self.k // 2)]
        parents = list(range(-1, len(a) - 1)) + [-1] + list(range(len(a), len(a) + len(b) - 1))
        return Draft(torch.tensor(a + b, dtype=torch.long), parents=torch.tensor(parents))

    def on_verified(self, state, outcome):
        self.ngram.on_verified(state, outcome)


def test_tree_drafts_under_load_and_a_tight_token_budget_are_lossless(tiny_model, monkeypatch):
    """Tree drafts served with preemption and a token budget (11) that cannot hold every row's whole
    tree: a tree is then cut to its first nodes (still a tree), and every request still equals
    plain greedy decoding alone."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(2, 4, (1,), generator=g)),), generator=g) for _ in range(40)]
    budgets = [int(torch.randint(5, 9, (1,), generator=g)) for _ in range(40)]
    arrivals = poisson_arrivals(len(prompts), rate_per_step=0.8, seed=2)
    refs = [autoregressive_generate(tiny_model, p, max_new_tokens=m, eos_token_id=EOS).tokens.tolist()
            for p, m in zip(prompts, budgets)]
    clipped = []
    real = sched_mod._clip_to_budget
    monkeypatch.setattr(sched_mod, "_clip_to_budget", lambda d, b: clipped.append(d.is_tree) or real(d, b))
    sched = _scheduler(tiny_model, NgramBesideCountingTree(3), AlwaysOn(6), max_num_batched_tokens=11, num_blocks=8)
    result = _run(sched, prompts, budgets, arrivals)
    assert result.num_preemptions > 0 and any(clipped)
    assert max(s.scheduled_tokens for s in result.steps) <= 11
    bad = [i for i, (r, ref) in enumerate(zip(result.requests, refs)) if r.output != ref]
    assert not bad, f"requests {bad[:5]} differ from plain greedy decoding alone"
    assert sum(r.stats.accepted for r in result.requests) > 0
