"""The advisor: counters read the same from vLLM's names, a Prometheus scrape and SpecStats; the
survivals predict a shorter K exactly (each draft truncated); the best K agrees with the i.i.d.
optimum; bad counters are refused. A planted wrong survival (per drafted token instead of per
draft) must fail the exactness check."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from support import make_tiny_llama, noisy
from specdecode_ref import analysis as A
from specdecode_ref import generate
from specdecode_ref.metrics import SpecStats
from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model
from specdecode_ref.proposers import load_proposer
from specdecode_ref.serving import advisor
from specdecode_ref.serving.advisor import AcceptanceProfile, advise
from specdecode_ref.serving.metrics import vllm_counters


def iid_stats(alpha: float, k: int, steps: int, seed: int = 0) -> SpecStats:
    """Counters of ``steps`` drafts of k tokens, each position kept with probability alpha until the
    first rejection."""
    rng = np.random.default_rng(seed)
    stats = SpecStats()
    for _ in range(steps):
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        stats.record_step(k, kept, kept + 1)
    return stats


@pytest.fixture(scope="module")
def real_stats():
    """A greedy run of a draft model on a tiny Llama: real accepted lengths, k = 5."""
    target = make_tiny_llama(vocab_size=64, seed=3, sharpness=2.0)
    draft = noisy(build_draft_model(copy.deepcopy(target), (1,)), 0.4, 1)
    out = generate(target, torch.tensor([5, 9, 2, 7, 7, 1, 3]), DraftModelProposer(draft, k=5), max_new_tokens=120,
                   stop_on_eos=False)
    assert out.stats.drafting_steps > 10 and 0 < out.stats.accepted < out.stats.drafted
    return out.stats


def prometheus_text(stats: SpecStats, engines=2) -> str:
    """A scrape as vLLM's /metrics prints it, the counts split over ``engines`` label sets."""
    c = vllm_counters(stats)
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter"]
    for e in range(engines):
        share = (lambda x: x - (engines - 1) * (x // engines)) if e == 0 else (lambda x: x // engines)
        lab = f'engine="{e}",model_name="smollm2"'
        lines += [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(share(c['vllm:spec_decode_num_drafts']))}",
                  f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(share(c['vllm:spec_decode_num_draft_tokens']))}",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} "
                  f"{float(share(c['vllm:spec_decode_num_accepted_tokens']))}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(share(v))}'
                  for i, v in enumerate(c["vllm:spec_decode_num_accepted_tokens_per_pos"])]
    lines.append("vllm:num_requests_running{engine=\"0\"} 3.0")
    return "\n".join(lines) + "\n"


def test_counters_read_alike_from_every_source(real_stats):
    a = AcceptanceProfile.from_stats(real_stats)
    b = AcceptanceProfile.from_counters(vllm_counters(real_stats))
    c = AcceptanceProfile.from_prometheus(prometheus_text(real_stats))
    assert b == c  # vLLM's four counters, however they are read
    # SpecStats also knows every step and the drafts' lengths, which vLLM's counters do not carry
    assert a.num_steps == real_stats.steps and sum(a.draft_length_counts) == real_stats.drafting_steps
    assert AcceptanceProfile(a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens, a.accepted_per_pos) == b
    assert a.mean_acceptance_length == pytest.approx(real_stats.vllm_mean_acceptance_length)
    assert a.tokens_per_step(a.k) == pytest.approx(a.mean_acceptance_length)
    assert a.acceptance_rate == pytest.approx(real_stats.acceptance_rate)


def truncated_tau(stats: SpecStats, k: int) -> float:
    """Tokens per drafting step had each draft been cut to k tokens: a greedy chain's first k tokens
    are the same draft, so a step keeps min(accepted, k) of them, plus the target's token."""
    kept = [a for a, d in zip(stats.accepted_lengths, stats.draft_lengths) if d > 0]
    return float(np.mean([1 + min(a, k) for a in kept]))


def wrong_survival(self):  # the planted bug: per drafted token, not per draft
    return np.asarray(self.accepted_per_pos, dtype=float) / self.num_draft_tokens


@pytest.mark.parametrize("bug", [None, "per_token_survival"])
def test_survivals_predict_every_shorter_k_exactly(real_stats, bug, monkeypatch):
    if bug:
        monkeypatch.setattr(AcceptanceProfile, "survival", property(wrong_survival))
    profile = AcceptanceProfile.from_stats(real_stats)

    def check():
        for k in range(1, profile.k + 1):
            assert profile.tokens_per_step(k) == pytest.approx(truncated_tau(real_stats, k), abs=1e-12)

    if bug:
        with pytest.raises(AssertionError):
            check()
    else:
        check()


def test_past_the_measured_k_survival_falls_by_alpha():
    stats = iid_stats(0.7, 4, 20000, seed=1)
    profile = AcceptanceProfile.from_stats(stats)
    assert profile.alpha == pytest.approx(A.estimate_alpha(stats.accepted_lengths, stats.draft_lengths))
    assert profile.alpha == pytest.approx(0.7, abs=0.01)
    # accepted / drafted is biased low (untested positions counted as failures): the estimate is not
    assert profile.acceptance_rate < 0.6
    for k in (6, 8):
        assert profile.tokens_per_step(k) == pytest.approx(float(A.expected_tokens_per_step(0.7, k)), rel=0.02)
    assert profile.conditional == pytest.approx([0.7] * 4, abs=0.02)


def test_best_k_is_the_iid_optimum_at_one_request():
    profile = AcceptanceProfile.from_stats(iid_stats(0.8, 10, 40000, seed=2))
    curve = {"ns": list(range(1, 12)), "times_s": [1.0 + 0.06 * (n - 1) for n in range(1, 12)]}
    c = 0.08
    adv = advise(profile, cost=curve, draft_cost=c, ks=range(1, 11))
    v = A.verify_cost_from_curve(curve["ns"], curve["times_s"])
    assert adv.best_k(1) == A.optimal_k(profile.alpha, c, v, k_max=10)
    row = adv.table[adv.table.K == 3].iloc[0]
    assert row.speedup == pytest.approx(profile.tokens_per_step(3) / (3 * c + v(3)))
    assert row.break_even_alpha == pytest.approx(A.break_even_alpha(3, c, v))
    assert not row.extrapolated and adv.table[adv.table.K == 10].extrapolated.iloc[0] == False  # noqa: E712


def test_a_full_batch_turns_speculation_off():
    """With a roofline whose knee is 16 tokens, 32 requests are compute-bound: every drafted token
    costs a full share of the forward, so plain decoding (K = 0) wins; one request speculates."""
    profile = AcceptanceProfile.from_stats(iid_stats(0.6, 4, 5000))
    adv = advise(profile, cost=advisor.roofline_cost(16.0), ks=range(1, 5), batch_sizes=(1, 32))
    assert adv.best_k(1) == 4 and adv.best_k(32) == 0
    assert adv.best.set_index("B").loc[32, "speedup"] == 1.0
    # a step of 4 drafts costs 5 plain steps there: only perfect acceptance breaks even
    assert adv.table[(adv.table.B == 32) & (adv.table.K == 4)].break_even_alpha.iloc[0] == pytest.approx(1.0)


def test_bad_counters_are_refused():
    with pytest.raises(ValueError, match="not drafted yet"):
        AcceptanceProfile(0, 0, 0, (0,))
    with pytest.raises(ValueError, match="different scrapes"):
        AcceptanceProfile(10, 40, 12, (8, 3))
    with pytest.raises(ValueError, match="must not increase"):
        AcceptanceProfile(10, 40, 9, (3, 6))
    with pytest.raises(KeyError, match="lack"):
        AcceptanceProfile.from_counters({"vllm:spec_decode_num_drafts": 3})
    with pytest.raises(ValueError, match="missing"):
        AcceptanceProfile.from_prometheus('vllm:spec_decode_num_drafts_total 5\n'
                                          'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n')
    profile = AcceptanceProfile(10, 40, 11, (8, 3))
    with pytest.raises(TypeError, match="cost must be"):
        advise(profile, cost="fast")
    with pytest.raises(ValueError, match="no batch size 4"):
        advise(profile, cost={"ns": [1, 2, 3], "times_s": [1.0, 1.1, 1.2]}, batch_sizes=(4,))
    later = AcceptanceProfile(30, 120, 31, (20, 11))
    assert later.difference(profile) == AcceptanceProfile(20, 80, 20, (12, 8))


def _run_on_the_curve():
    """A synthetic cost curve T(n) and the pooled counters of a plain run and a speculative run whose
    forwards take exactly T(n) and whose drafting takes 2 ms per step: (T, curve, plain, spec)."""
    T = lambda n: 0.01 * (1 + 0.05 * (n - 1))  # noqa: E731
    curve = {"ns": list(range(1, 9)), "times_s": [T(n) for n in range(1, 9)]}
    plain = {"steps": 100, "emitted": 100, "prefill_time_s": 0.1, "target_time_s": 0.1 + 100 * T(1),
             "draft_time_s": 0.0, "wall_time_s": 0.1 + 100 * T(1), "spec_decode_num_drafts": 0}
    spec = {"steps": 50, "emitted": 120, "spec_decode_num_drafts": 50, "spec_decode_num_draft_tokens": 150,
            "spec_decode_num_accepted_tokens": 70, "spec_decode_num_accepted_tokens_per_pos": [40, 20, 10],
            "draft_length_counts": [0, 0, 50],
            "prefill_time_s": 0.1, "target_time_s": 0.1 + 50 * T(4), "draft_time_s": 50 * 0.002}
    spec["wall_time_s"] = spec["target_time_s"] + spec["draft_time_s"]
    return T, curve, plain, spec


def test_prediction_matches_a_run_whose_forwards_follow_the_curve():
    """Forward times exactly on the cost curve, drafting timed, no other overhead: the predicted
    decode speedup is the measured one; a 1 ms per step overhead moves both sides alike only in the
    prediction that includes it."""
    T, curve, plain, spec = _run_on_the_curve()
    row = advisor.predicted_vs_measured({"plain": plain, "spec": spec}, curve).iloc[0]
    expected = (120 / (50 * T(4) + 50 * 0.002)) / (100 / (100 * T(1)))
    assert row.measured == pytest.approx(expected) and row.predicted == pytest.approx(expected)
    assert row.predicted_with_overheads == pytest.approx(expected) and row.k_mean == 3
    slow = dict(spec, wall_time_s=spec["wall_time_s"] + 50 * 0.001)
    row = advisor.predicted_vs_measured({"plain": plain, "spec": slow}, curve).iloc[0]
    assert row.predicted_with_overheads == pytest.approx(row.measured) and row.predicted > row.measured


def test_out_of_sample_check_predicts_from_one_run_and_measures_on_another():
    """measured_on: the prediction comes from the fitting run's counters, the measurement from the
    other run's. Planted twin: measuring on the fitting run itself (in sample)."""
    T, curve, plain, spec = _run_on_the_curve()
    fit = {"plain": plain, "spec": spec}
    held = {"plain": plain, "spec": dict(spec, steps=60, emitted=120, target_time_s=0.1 + 60 * T(4),
                                         wall_time_s=0.1 + 60 * (T(4) + 0.002))}  # held-out prompts accept less
    inside = advisor.predicted_vs_measured(fit, curve).iloc[0]
    outside = advisor.predicted_vs_measured(fit, curve, measured_on=held).iloc[0]
    assert outside.predicted == pytest.approx(inside.predicted), "the prediction comes from the fitting run"
    expected = (120 / (60 * (T(4) + 0.002))) / (100 / (100 * T(1)))
    assert outside.measured == pytest.approx(expected) and outside.tau == pytest.approx(2.0)
    assert outside.measured_over_predicted < 1 and inside.measured_over_predicted == pytest.approx(1)
    with pytest.raises(ValueError, match="not in the run"):
        advisor.predicted_vs_measured(fit, curve, measured_on={"plain": plain})


def test_fitted_k_reads_this_machines_curve_once(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    from specdecode_ref.measure.harness import timing

    calls = []
    real = timing.measure_cost_curve
    monkeypatch.setattr(timing, "measure_cost_curve", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    good = vllm_counters(iid_stats(0.9, 6, 3000, seed=3))
    bad = vllm_counters(iid_stats(0.1, 6, 3000, seed=4))
    counters = {"_t1_s": 1.0,
                "good": {**{k.removeprefix("vllm:"): v for k, v in good.items()}, "draft_time_s": 0.0},
                "bad": {**{k.removeprefix("vllm:"): v for k, v in bad.items()}, "draft_time_s": 0.5 * 18000}}
    k_good, adv = advisor.fitted_k("good", tiny_model, ks=range(1, 7), counters=counters)
    k_bad, _ = advisor.fitted_k("bad", tiny_model, ks=range(1, 7), counters=counters)
    assert k_good >= 3 and k_bad == 0 and len(calls) == 1  # measured once, then read from the cache
    assert adv.speedup(1, k_good) == adv.best.speedup.iloc[0]
    with pytest.raises(ValueError, match="no stored acceptance counters"):
        advisor.fitted_k("eagle", tiny_model, counters=counters)
    with pytest.raises(ValueError, match="load_fitted"):
        load_proposer("ngram", tiny_model, k="auto")


def synthetic_records(stats: SpecStats, target_s: float, draft_s: float, T, plain_engine_s: float) -> tuple:
    """The measured records of a synthetic run, as the benchmark writes them: the speculative run
    (its counters, ``target_s`` of target forwards, ``draft_s`` of drafting, 2 ms of engine time per
    step), plain decoding (1000 steps of T(1), ``plain_engine_s`` each) and the cost curve T(1..9)."""
    spec = {**{k.removeprefix("vllm:"): v for k, v in vllm_counters(stats).items()},
            "steps": stats.steps, "emitted": stats.emitted,
            "draft_length_counts": list(AcceptanceProfile.from_stats(stats).draft_length_counts),
            "prefill_time_s": 0.1, "target_time_s": 0.1 + target_s, "draft_time_s": draft_s}
    spec["wall_time_s"] = spec["target_time_s"] + spec["draft_time_s"] + 0.002 * stats.steps
    plain = {"steps": 1000, "emitted": 1000, "prefill_time_s": 0.1, "target_time_s": 0.1 + 1000 * T(1),
             "draft_time_s": 0.0, "spec_decode_num_drafts": 0}
    plain["wall_time_s"] = plain["target_time_s"] + plain_engine_s * 1000
    curve = {"ns": list(range(1, 10)), "times_s": [T(n) for n in range(1, 10)]}
    return spec, plain, curve


def skipping_run(seed: int = 0, steps: int = 4000):
    """An n-gram-like run: 40 % of steps draft nothing, the others 1..5 tokens, each kept with
    probability 0.6 until the first rejection; every forward takes exactly T(n) of ``curve``, each
    drafted token 0.5 ms, each step 2 ms of engine time (1 ms on plain decoding's steps)."""
    rng = np.random.default_rng(seed)
    T = lambda n: 0.02 * (1 + 0.15 * (n - 1))  # noqa: E731
    stats, target = SpecStats(), 0.0
    for _ in range(steps):
        m = 0 if rng.random() < 0.4 else int(rng.choice([1, 2, 3, 4, 5], p=[0.3, 0.3, 0.1, 0.1, 0.2]))
        kept = 0
        while kept < m and rng.random() < 0.6:
            kept += 1
        stats.record_step(m, kept, kept + 1)
        target += T(m + 1)
    spec, plain, curve = synthetic_records(stats, target, 0.0005 * stats.drafted, T, plain_engine_s=0.001)
    return {"plain": plain, "ngram": spec}, curve, stats


@pytest.mark.parametrize("bug", [None, "every step drafts K"])
def test_a_drafter_that_skips_steps_and_drafts_short_is_predicted_exactly(bug, monkeypatch):
    """Steps without a draft cost T(1) and emit 1 token; a short draft costs T(its length + 1): with
    the drafting share and the draft lengths the prediction equals the measured decode speedup. The
    planted bug (charge T(K+1) and take tokens per drafting step on every step, the formula of a
    drafter that always drafts K) must miss it."""
    counters, curve, stats = skipping_run()
    profile = AcceptanceProfile.from_stats(stats)
    assert 0.55 < profile.drafting_share < 0.65 and profile.mean_draft_length < 5
    if bug:
        monkeypatch.setattr(AcceptanceProfile, "drafting_share", property(lambda self: 1.0))
        monkeypatch.setattr(AcceptanceProfile, "draft_lengths",
                            lambda self, k: (np.array([float(k)]), np.array([1.0])))
    row = advisor.predicted_vs_measured(counters, curve).iloc[0]
    if bug:
        assert abs(row.measured_over_predicted - 1) > 0.05
    else:
        assert row.measured_over_predicted == pytest.approx(1.0, abs=1e-9)
        assert row.drafting_share == pytest.approx(profile.drafting_share) and row.k == 5


def parallel_run(k: int = 4, seed: int = 0, steps: int = 3000):
    """A parallel drafter's run: every step drafts k tokens in ONE draft forward of 6 ms (whatever k),
    kept with probabilities that fall with depth; forwards take exactly T(n)."""
    rng = np.random.default_rng(seed)
    T = lambda n: 0.02 * (1 + 0.05 * (n - 1))  # noqa: E731
    stats, target = SpecStats(), 0.0
    keep = [0.7, 0.5, 0.35, 0.25][:k]
    for _ in range(steps):
        kept = 0
        while kept < k and rng.random() < keep[kept]:
            kept += 1
        stats.record_step(k, kept, kept + 1)
        target += T(k + 1)
    spec, plain, curve = synthetic_records(stats, target, 0.006 * stats.steps, T, plain_engine_s=0.002)
    return {"plain": plain, f"pard@{k}": spec}, curve


@pytest.mark.parametrize("bug", [None, "charged per drafted token"])
def test_a_parallel_drafter_is_charged_one_forward_per_step(bug, monkeypatch):
    """A parallel drafter pays its draft forward once per drafting step: charged so (run_costs'
    draft_step), the prediction equals the measured speedup at its own K, and the cost it predicts
    for a shorter K keeps the same drafting time. The planted bug charges the drafter per drafted
    token as for a sequential draft, which must miss a K it did not run at."""
    counters, curve = parallel_run()
    if bug:
        monkeypatch.setattr(advisor, "is_parallel", lambda name: False)
    rc = advisor.run_costs(counters, "pard@4")
    row = advisor.predicted_vs_measured(counters, curve).iloc[0]
    assert row.measured_over_predicted == pytest.approx(1.0, abs=1e-9)  # at its own K both charges agree
    step = advisor.run_cost_curve(curve, rc.t1)
    k2 = advisor.step_cost(rc.profile, 2, step, draft_cost=rc.draft, overhead=rc.overhead,
                           draft_step_cost=rc.draft_step)
    expected = step(1, 3) + 0.006 + 0.002  # T(3) + one draft forward + the engine's time
    if bug:
        assert abs(k2 - expected) > 1e-3
    else:
        assert rc.draft == 0 and rc.draft_step == pytest.approx(0.006)
        assert k2 == pytest.approx(expected, rel=1e-9)


def test_tokens_per_decode_step_counts_steps_that_do_not_draft():
    counters, _, stats = skipping_run(seed=1, steps=3000)
    profile = AcceptanceProfile.from_counters(counters["ngram"])
    assert profile.tokens_per_decode_step(profile.k) == pytest.approx(stats.emitted / stats.steps)
    assert profile.tokens_per_step(profile.k) > profile.tokens_per_decode_step(profile.k)
    # asked for 2, a step drafts min(L, 2): the lengths say how many tokens that is on average
    lengths, w = profile.draft_lengths(2)
    assert float(np.dot(lengths, w)) == pytest.approx(
        sum(min(n, 2) for n in stats.draft_lengths if n) / stats.drafting_steps)
    with pytest.raises(ValueError, match="draft_length_counts"):
        AcceptanceProfile(10, 20, 5, (4, 1), num_steps=12, draft_length_counts=(5, 4))
    with pytest.raises(ValueError, match="num_steps"):
        AcceptanceProfile(10, 20, 5, (4, 1), num_steps=8)


def test_fitted_tree_follows_the_machines_cost_curve():
    """Medusa's tree sized by this machine's curve: a GPU-like flat curve buys a large tree, a curve
    as steep as n separate steps buys plain decoding; a planted sizer that ignores the curve gives
    one answer for both and is caught by the same check."""
    from specdecode_ref.serving.advisor import fitted_tree

    ns = list(range(1, 34))
    flat = {"ns": ns, "times_s": [0.02] * len(ns)}
    steep = {"ns": ns, "times_s": [0.02 * n for n in ns]}

    def sizes_by_curve(sizer) -> bool:
        return sizer(flat) >= 16 and sizer(steep) <= 1

    assert sizes_by_curve(lambda curve: fitted_tree("medusa", None, cost_curve=curve).budget)
    assert not sizes_by_curve(lambda curve: fitted_tree("medusa", None, cost_curve=flat).budget)  # planted
    assert fitted_tree("medusa", None, cost_curve=flat).tokens_per_s > 1 / 0.02
    with pytest.raises(ValueError, match="sizes the trees"):
        fitted_tree("eagle", None, cost_curve=flat)


def test_load_fitted_sizes_a_tree_by_the_curve_and_warns_when_plain_wins(monkeypatch):
    """load_fitted builds Medusa with the budget fitted_tree chose; where no tree beats plain decoding
    it says so and drafts the smallest. The drafter's construction is stubbed: this is the choice."""
    import specdecode_ref.proposers as proposers
    from specdecode_ref.serving import advisor

    built = []
    monkeypatch.setattr(proposers, "load_proposer", lambda name, model, k, **kw: built.append((name, k)) or k)
    ns = list(range(1, 34))
    for times, want in (([0.02] * len(ns), "large"), ([0.02 * n for n in ns], "plain")):
        monkeypatch.setattr(advisor, "machine_cost_curve",
                            lambda model, max_n=10, refresh=False, t=times: {"ns": ns, "times_s": t})
        if want == "plain":
            with pytest.warns(UserWarning, match="no tree size makes 'medusa' faster"):
                assert advisor.load_fitted("medusa", None) == 1
        else:
            assert advisor.load_fitted("medusa", None) >= 16
    assert [name for name, _ in built] == ["medusa", "medusa"]
