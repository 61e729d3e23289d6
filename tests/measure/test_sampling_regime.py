"""The sampling-regime measurement: the acceptance the theory predicts (1 - TV(p, q) when drafting
from q, p(a*) for a one-hot draft) matches the measured α within its standard error, a wrong
formula does not, and the table / plot / CLI pieces have the promised shape."""
import math

import numpy as np
import pytest
import torch

from support import make_tiny_llama, noisy
from specdecode_ref import chat_ids, generate
from specdecode_ref.analysis import estimate_alpha
from specdecode_ref.measure import sampling_regime as sr
from specdecode_ref.measure.harness.workloads import load_workloads
from specdecode_ref.metrics import merge_stats
from specdecode_ref.proposers import load_proposer
from specdecode_ref.proposers.draft_model import DraftModelProposer, build_draft_model
from specdecode_ref.proposers.early_exit import EarlyExitProposer, build_adapter
from specdecode_ref.proposers.medusa import MedusaHeads, MedusaProposer


@pytest.fixture(scope="module")
def target():
    return make_tiny_llama(vocab_size=64, sharpness=4.0, seed=3, layers=4, init_range=0.3)


@pytest.fixture(scope="module")
def close_draft(target):
    """All four layers with a little noise: q tracks p, so the two regimes differ at T = 1."""
    draft = build_draft_model(target, (0, 1, 2, 3))
    noisy(draft.model.layers, 0.03, 0)
    return draft


def prompts(n=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 64, (6,), generator=g) for _ in range(n)]


def probe_run(target, proposer, sampling, n=16, max_new_tokens=40):
    probe = sr.AcceptanceProbe(proposer)
    results = [generate(target, p, probe, max_new_tokens=max_new_tokens, sampling=sampling, seed=i)
               for i, p in enumerate(prompts(n))]
    return probe.total(), merge_stats(r.stats for r in results)


def test_predicted_acceptance_matches_measured_in_both_regimes(target, close_draft):
    sampling = sr.regime_sampling(1.0)
    alphas = {}
    for mode in ("sample", "greedy"):
        record, stats = probe_run(target, DraftModelProposer(close_draft, k=3, draft_sampling=mode), sampling)
        assert record.tried > 300
        # the probe counts the same tried positions as the engine's counters
        assert record.accepted / record.tried == pytest.approx(estimate_alpha(stats.accepted_lengths,
                                                                              stats.draft_lengths))
        assert abs(record.z) < 4, (mode, record)
        alphas[mode] = record.accepted / record.tried
    # q tracks p at T = 1: 1 - TV(p, q) beats p(a*), measured as predicted
    assert alphas["sample"] > alphas["greedy"] + 0.05


def test_a_wrong_acceptance_formula_is_caught(target, close_draft, monkeypatch):
    """Predict "accept x with probability p(x)" for sampled drafts (E_q[p(x)] = sum p q) instead of
    sum min(p, q): the measured α disagrees with it by more than 4 standard errors."""
    monkeypatch.setattr(sr, "acceptance_with_q", lambda p, q: (p * q).sum(-1))
    record, _ = probe_run(target, DraftModelProposer(close_draft, k=3), sr.regime_sampling(1.0))
    assert record.z > 4


def test_probe_reads_a_proposers_own_scoring_forward(target):
    """Early exit runs the verification forward itself (scores_draft): the probe takes p from it."""
    adapter = noisy(build_adapter(target, 2), 0.3, 0)
    proposer = EarlyExitProposer(target, adapter, k=3)
    record, stats = probe_run(target, proposer, sr.regime_sampling(0.7), n=8)
    assert record.tried > 100 and abs(record.z) < 4
    assert stats.accepted == record.accepted


def tiny_build(target, draft):
    def build(name, model, k, mode):
        if name == "ngram":
            return load_proposer("ngram", draft_sampling=mode)
        if name == "draft":
            return DraftModelProposer(draft, k=3, draft_sampling=mode)
        if name == "medusa":
            return MedusaProposer(target, MedusaHeads(target.config.hidden_size, 2), choices=[(0,), (1,), (0, 0)], draft_sampling=mode)
        raise ValueError(f"unknown drafter {name!r}")
    return build


def test_regime_table_rows_and_columns(target, close_draft):
    df = sr.run_sampling_regime(target, drafters=["ngram", "draft", "medusa"], temperatures=(0.0, 1.0),
                                prompts=prompts(3), max_new_tokens=16, build=tiny_build(target, close_draft))
    got = list(zip(df["drafter"], df["temperature"], df["draft_sampling"]))
    assert got == [("ngram", 0.0, "greedy"), ("draft", 0.0, "greedy"), ("medusa", 0.0, "greedy"),
                   ("ngram", 1.0, "greedy"), ("draft", 1.0, "sample"), ("draft", 1.0, "greedy"),
                   ("medusa", 1.0, "greedy")]
    assert {"α", "α predicted", "z", "acceptance rate", "τ", "tokens", "top_p"} <= set(df.columns)
    assert "speedup" not in df.columns
    tree = df[df["drafter"] == "medusa"]
    assert tree["α"].isna().all() and (tree["τ"] >= 1).all()  # per-token α is for chains
    draft = df[df["drafter"] == "draft"]
    assert draft["α"].between(0, 1).all() and draft["α predicted"].between(0, 1).all()
    assert df.loc[df["temperature"] == 1.0, "top_p"].eq(sr.TOP_P).all()
    # at T = 0 the prediction is exact: every tried position is accepted iff it is the argmax
    zero = df[(df["temperature"] == 0.0) & (df["drafter"] == "draft")].iloc[0]
    assert zero["α"] == pytest.approx(zero["α predicted"]) and zero["z"] == 0.0
    fig = sr.plot_sampling_regime(df, "α")
    assert len(fig.axes[0].patches) == 3 * 3  # 3 drafters x 3 conditions (absent ones are NaN bars)
    with pytest.raises(ValueError, match="no column"):
        sr.plot_sampling_regime(df, "speed")


def test_regime_timing_and_errors(target, close_draft):
    build = tiny_build(target, close_draft)
    df = sr.run_sampling_regime(target, drafters=["draft"], temperatures=(0.7,), prompts=prompts(2),
                                max_new_tokens=8, build=build, timing=True, predict=False, warmup=0)
    assert {"tokens/s", "speedup"} <= set(df.columns) and df["α predicted"].isna().all()
    with pytest.raises(ValueError, match="unknown drafter"):
        sr.run_sampling_regime(target, drafters=["nope"], temperatures=(1.0,), prompts=prompts(1), build=build)
    with pytest.raises(ValueError, match="modes"):
        sr.run_sampling_regime(target, drafters=["draft"], modes=("argmax",), prompts=prompts(1), build=build)
    assert sr.regime_sampling(0).is_greedy and sr.regime_sampling(0.7).top_p == 0.95


def test_cli_parser_quick():
    args = sr.build_parser().parse_args(["--quick", "--drafters", "draft,eagle"])
    assert args.quick and args.drafters == "draft,eagle" and args.per_category is None


def test_shipped_drafters_acceptance_matches_theory(embedded):
    """The real target and the shipped drafters: in both regimes the measured α agrees with the
    mean of 1 - TV(p, q) or p(a*) over the same positions (2 prompts, 32 tokens, T = 1)."""
    model, tok = embedded
    wl = load_workloads(["qa", "rewrite"], per_category=1)
    ids = [chat_ids(tok, p["messages"]) for c in wl for p in wl[c]]
    for name in ("draft", "eagle"):
        for mode in ("sample", "greedy"):
            probe = sr.AcceptanceProbe(load_proposer(name, model, draft_sampling=mode))
            for i, x in enumerate(ids):
                generate(model, x, probe, max_new_tokens=32, sampling=sr.regime_sampling(1.0), seed=i)
            record = probe.total()
            assert record.tried > 20 and abs(record.z) < 4, (name, mode, record)
            assert math.isfinite(record.alpha_predicted) and 0 < record.alpha_predicted < 1
    assert np.isfinite(record.variance)
