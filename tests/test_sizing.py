"""sizing.py: cost curves, the cached measurement, chain and tree sizing (Sequoia's DP), per batch.

Every check is an assertion helper that is also run on a planted wrong twin, which must fail it:
a helper that a broken implementation passes proves nothing. No model, no timing: seconds.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from specdecode_ref import sizing
from specdecode_ref.analysis import expected_tokens_from_position_rates
from specdecode_ref.sizing import CostCurve

T1 = 0.010  # seconds of one plain step in the synthetic curves
NS = [1, 2, 4, 8, 16, 32, 64]
FLAT = CostCurve(NS, [T1] * len(NS), device="synthetic")  # T(n) = T(1) for n <= 64: memory-bound
STEEP = CostCurve(NS, [T1 * n for n in NS], device="synthetic")  # T(n) = n T(1): compute-bound
CHAIN_RATES = [0.8] * 32
RANK_RATES = [0.6, 0.2, 0.1]


def _fails(check, *args, **kwargs) -> bool:
    """True when ``check`` raises AssertionError: a planted twin must make its helper fail."""
    try:
        check(*args, **kwargs)
    except AssertionError:
        return True
    return False


# ---- 1. the cost curve ---------------------------------------------------------------------------

def check_cost_curve(make):
    """Interpolation, extrapolation with the last slope, raw (non-monotone) values kept, relative, JSON."""
    c = make([1, 2, 4], [0.010, 0.011, 0.014])
    assert c.cost(1) == pytest.approx(0.010)
    assert c.cost(3) == pytest.approx(0.0125)  # halfway between T(2) and T(4)
    assert c.cost(6) == pytest.approx(0.014 + 2 * 0.0015)  # last segment's slope (0.003 / 2)
    assert c.relative(4) == pytest.approx(1.4)
    dip = make([1, 2, 3], [1.0, 0.9, 1.2])
    assert dip.cost(2) == pytest.approx(0.9) and dip.relative(2) == pytest.approx(0.9)  # no clipping
    back = CostCurve.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c


def test_cost_curve():
    check_cost_curve(CostCurve)
    labelled = CostCurve([1, 2], [1e-3, 2e-3], device="cpu", dtype="bf16", backend="fast", machine="m")
    assert CostCurve.from_dict(labelled.to_dict()) == labelled
    bench_dict = {"ns": [1, 2], "times_s": [1e-3, 1.5e-3], "relative": [1, 1.5], "device": "cpu", "dtype": "float32"}
    assert CostCurve.from_dict(bench_dict).dtype == "float32"
    assert sizing.as_cost_fn(bench_dict)(2) == pytest.approx(1.5e-3)


class _Monotone(CostCurve):
    """Planted twin: smooths the curve (what analysis.as_verify_cost does by default) instead of
    keeping the measured dip."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "times_s", tuple(np.maximum.accumulate(self.times_s)))


def test_cost_curve_twin_that_smooths_is_caught():
    assert _fails(check_cost_curve, _Monotone)


# ---- 5 (used throughout). bad inputs ---------------------------------------------------------------

BAD_CURVES = [  # (ns, times, words the message must contain)
    ([1, 4, 2], [1.0, 2.0, 3.0], "strictly increasing"),
    ([1, 2, 2], [1.0, 2.0, 3.0], "strictly increasing"),
    ([0, 1, 2], [1.0, 2.0, 3.0], ">= 1"),
    ([1, 2], [1.0, 0.0], "> 0"),
    ([1, 2], [1.0, -1.0], "> 0"),
    ([1, 2], [1.0, float("nan")], "> 0"),
    ([1, 2, 3], [1.0, 2.0], "one time per token count"),
    ([1], [1.0], "at least two points"),
    ([2, 3], [1.0, 2.0], "start at 1"),
    ([1, 2.5], [1.0, 2.0], "whole"),
]


def check_rejects(make):
    for ns, times, words in BAD_CURVES:
        try:
            make(ns, times)
        except ValueError as e:
            assert words in str(e), f"message for {ns}, {times} does not say {words!r}: {e}"
        else:
            raise AssertionError(f"CostCurve({ns}, {times}) was accepted")


def test_bad_inputs_raise_clear_value_errors():
    check_rejects(CostCurve)
    c = CostCurve([1, 2], [1.0, 2.0])
    for call, words in [
        (lambda: c.cost(0), ">= 1"),
        (lambda: sizing.chain_speed([0.5, 1.5], 1, c), "[0, 1]"),
        (lambda: sizing.chain_speed([0.5], 2, c), "needs 2"),
        (lambda: sizing.chain_speed([0.5], -1, c), "int >= 0"),
        (lambda: sizing.chain_speed([0.5], 1, lambda n: -1.0), "> 0"),
        (lambda: sizing.chain_speed([0.5], 1, c, draft_cost_s=-0.1), ">= 0"),
        (lambda: sizing.chain_speed([0.5], 1, "fast"), "CostCurve"),
        (lambda: sizing.optimal_tree([0.5, 0.6], 3), "sums to"),  # cumulative top-k accuracies
        (lambda: sizing.optimal_tree([[0.5, -0.1]], 3), "[0, 1]"),
        (lambda: sizing.optimal_tree(np.zeros((2, 2, 2)), 3), "[depth, R]"),
        (lambda: sizing.best_tree(RANK_RATES, c, 0.001, [0, 2]), "function (n_nodes, depth)"),
        (lambda: sizing.best_tree(RANK_RATES, c, sizing.per_level_draft_cost(0), []), "at least one"),
        (lambda: sizing.choose("forest", RANK_RATES, c, 0.0), "'chain' or 'tree'"),
    ]:
        with pytest.raises(ValueError, match=None) as info:
            call()
        assert words in str(info.value), f"{words!r} not in {info.value}"


def _permissive_curve(ns, times):
    """Planted twin: a 'curve' that checks nothing."""
    return SimpleNamespace(ns=ns, times_s=times)


def test_permissive_twin_is_caught():
    assert _fails(check_rejects, _permissive_curve)


# ---- 4. chain_speed against a hand computation ---------------------------------------------------------

def check_chain_speed(speed):
    c = CostCurve([1, 2, 4], [0.010, 0.011, 0.014])
    rates = [0.9, 0.5, 0.2]
    tau = 1 + 0.9 + 0.9 * 0.5  # 2.35
    # k = 2 verifies 3 tokens: T(3) = 0.0125; two drafted tokens at 2 ms each.
    assert speed(rates, 2, c, 0.002) == pytest.approx(tau / (0.0125 + 0.004))
    assert speed(rates, 2, c, lambda k: 0.001 + 0.001 * k) == pytest.approx(tau / (0.0125 + 0.003))
    assert speed(rates, 0, c, 0.002) == pytest.approx(1 / 0.010)  # plain decoding, no drafting
    assert speed(rates, 3, c, 0.0) == pytest.approx((tau + 0.9 * 0.5 * 0.2) / 0.014)


def test_chain_speed_by_hand():
    check_chain_speed(sizing.chain_speed)
    choice = sizing.best_chain([0.9, 0.5, 0.2], CostCurve([1, 2, 4], [0.010, 0.011, 0.014]), 0.002)
    assert [row.k for row in choice.table] == [0, 1, 2, 3]
    assert choice.tokens_per_s == max(row.tokens_per_s for row in choice.table)
    assert choice.table[choice.k].tokens_per_s == choice.tokens_per_s
    assert choice.table[2].tau == pytest.approx(expected_tokens_from_position_rates([0.9, 0.5]))


def _speed_verifying_k_tokens(rates, k, curve, draft):
    """Planted twin: scores k tokens instead of k + 1 (forgets the root)."""
    tau = 1 + float(np.cumprod(rates[:k]).sum())
    d = draft(k) if callable(draft) else draft * k
    return tau / (curve.cost(max(k, 1)) + d)


def _speed_without_bonus(rates, k, curve, draft):
    """Planted twin: tau without the target's own token."""
    d = draft(k) if callable(draft) else draft * k
    return max(float(np.cumprod(rates[:k]).sum()), 1.0 if k == 0 else 0.0) / (curve.cost(k + 1) + d)


def test_chain_speed_twins_are_caught():
    assert _fails(check_chain_speed, _speed_verifying_k_tokens)
    assert _fails(check_chain_speed, _speed_without_bonus)


# ---- 3. flat curve -> big draft, steep curve -> plain or k = 1 ----------------------------------------

def check_sizes_follow_curve(pick_chain, pick_tree):
    """pick_chain(curve) -> k, pick_tree(curve) -> node budget."""
    k_flat, k_steep = pick_chain(FLAT), pick_chain(STEEP)
    assert k_flat >= 6, f"a flat curve should draft a long chain, got k = {k_flat}"
    assert k_steep <= 1, f"T(n) = n T(1) should give plain decoding or k = 1, got k = {k_steep}"
    n_flat, n_steep = pick_tree(FLAT), pick_tree(STEEP)
    assert n_flat >= 16, f"a flat curve should draft a big tree, got {n_flat} nodes"
    assert n_steep <= 1, f"T(n) = n T(1) should give plain decoding or one node, got {n_steep}"


def _chain_pick(curve):
    return sizing.best_chain(CHAIN_RATES, curve, 0.05 * T1).k


def _tree_pick(curve):
    return sizing.best_tree(RANK_RATES, curve, sizing.per_level_draft_cost(0.05 * T1), range(0, 65), 12).budget


def test_flat_curve_drafts_big_steep_curve_drafts_nothing():
    check_sizes_follow_curve(_chain_pick, _tree_pick)
    assert sizing.best_chain(CHAIN_RATES, STEEP, 0.05 * T1).k == 0  # tau(k) < k + 1 = T(k+1)/T(1)
    tree = sizing.best_tree(RANK_RATES, FLAT, sizing.per_level_draft_cost(0.05 * T1), range(0, 65), 12)
    assert tree.tree.n_nodes == tree.budget and tree.tree.depth <= 12
    assert [row.budget for row in tree.table] == list(range(65))
    assert tree.table[0].tokens_per_s == pytest.approx(1 / T1)
    # Medusa-like heads (one forward for every level) with the same rates: a flat curve goes deep too.
    medusa = sizing.best_tree(RANK_RATES, FLAT, sizing.per_step_draft_cost(0.05 * T1), range(0, 33), 8)
    assert medusa.budget >= 16


def _ignores_curve_chain(curve):
    """Planted twin: maximises tau alone (the cost curve never enters)."""
    return max(range(len(CHAIN_RATES) + 1), key=lambda k: expected_tokens_from_position_rates(CHAIN_RATES[:k]))


def _ignores_curve_tree(curve):
    return sizing.best_tree(RANK_RATES, lambda n: T1, sizing.per_level_draft_cost(0.0), range(0, 65), 12).budget


def test_optimizer_that_ignores_the_curve_is_caught():
    assert _ignores_curve_chain(FLAT) == _ignores_curve_chain(STEEP)
    assert _fails(check_sizes_follow_curve, _ignores_curve_chain, _tree_pick)
    assert _fails(check_sizes_follow_curve, _chain_pick, _ignores_curve_tree)


# ---- 5 (batch). the best size shrinks as the curve steepens -------------------------------------------

def _batch_cost(b, n):
    return T1 * (1.0 + b * n / 64.0)  # one request: nearly flat; 64 requests: T grows with every token


def check_shrinks_with_batch(choose_per_batch):
    for kind, rates, draft, size in [("chain", CHAIN_RATES, 0.02 * T1, lambda c: c.k),
                                     ("tree", RANK_RATES, sizing.per_level_draft_cost(0.02 * T1), lambda c: c.budget)]:
        kwargs = {"budgets": range(0, 33), "max_depth": 8} if kind == "tree" else {}
        sizes = [size(c) for c in choose_per_batch(kind, rates, _batch_cost, [1, 4, 16, 64], draft, **kwargs).values()]
        assert all(a >= b for a, b in zip(sizes, sizes[1:])), f"{kind}: sizes {sizes} grow with the batch"
        assert sizes[0] > sizes[-1], f"{kind}: sizes {sizes} do not shrink from B = 1 to B = 64"


def _per_batch_ignoring_b(kind, rates, batch_cost, batch_sizes, draft, **kwargs):
    """Planted twin: uses the single-request curve for every batch size."""
    return {b: sizing.choose(kind, rates, lambda n: batch_cost(1, n), draft, **kwargs) for b in batch_sizes}


def test_best_size_shrinks_with_batch():
    check_shrinks_with_batch(sizing.choose_per_batch)
    assert _fails(check_shrinks_with_batch, _per_batch_ignoring_b)


# ---- 4 (trees). the DP against brute force -----------------------------------------------------------

def _forests(k, depth, max_depth, rank, ranks):
    """Every ordered forest of exactly k nodes hanging under one node, children taking ranks
    rank, rank + 1, ... in order, as tuples of (rank, subforest); the children sit at ``depth``."""
    if k == 0:
        yield ()
        return
    if rank >= ranks or depth > max_depth:
        return
    for s in range(1, k + 1):
        for sub in _forests(s - 1, depth + 1, max_depth, 0, ranks):
            for rest in _forests(k - s, depth, max_depth, rank + 1, ranks):
                yield ((rank, sub),) + rest


def _value(forest, depth, table):
    row = table[min(depth - 1, len(table) - 1)]
    return sum(row[r] * (1.0 + _value(sub, depth + 1, table)) for r, sub in forest)


def _brute_tau(rank_rates, budget, max_depth):
    table = np.atleast_2d(np.asarray(rank_rates, dtype=float))
    best = 0.0
    for k in range(budget + 1):
        for f in _forests(k, 1, max_depth, 0, table.shape[1]):
            best = max(best, _value(f, 1, table))
    return 1.0 + best


def test_brute_force_enumerates_every_ordered_tree():
    catalan = [1, 1, 2, 5, 14, 42, 132, 429]  # ordered forests of k nodes, no rank or depth limit
    assert [sum(1 for _ in _forests(k, 1, 99, 0, 99)) for k in range(8)] == catalan
    assert sum(1 for _ in _forests(3, 1, 1, 0, 99)) == 1  # depth 1: only the star
    assert sum(1 for _ in _forests(3, 1, 99, 0, 1)) == 1  # one rank: only the chain


def _random_rates(rng, shape):
    """Rows sorted non-increasing, summing to < 1 (disjoint ranks)."""
    x = -np.sort(-rng.dirichlet(np.ones(shape[-1] + 1), size=shape[:-1] or None)[..., :-1], axis=-1)
    return x


CASES = [(seed, shape, depth) for seed in range(4) for shape, depth in
         [((3,), None), ((2,), 2), ((3,), 3), ((3, 3), None), ((2, 2), 2), ((4, 2), 3)]]


def check_dp_matches_brute_force(optimal):
    """optimal(rank_rates, budget, max_depth) -> SizedTree."""
    for seed, shape, depth in CASES:
        rates = _random_rates(np.random.default_rng(seed), shape)
        for budget in range(0, 7):
            cap = budget if depth is None else depth
            tree = optimal(rates, budget, depth)
            want = _brute_tau(rates, budget, cap)
            assert tree.n_nodes <= budget, f"{tree.n_nodes} nodes for a budget of {budget}"
            assert tree.depth <= cap, f"depth {tree.depth} over the cap {cap}"
            assert tree.tau == pytest.approx(want, rel=1e-12), (seed, shape, depth, budget)
            # the tree it returns really has the tau it claims (medusa.expected_accepted)
            assert sizing.tree_tau(rates, tree.choices) == pytest.approx(tree.tau, rel=1e-12)


def test_dp_equals_brute_force():
    check_dp_matches_brute_force(sizing.optimal_tree)


def _dp_off_by_one(rates, budget, depth):
    """Planted twin: a DP whose budget counts the root as a node (one node short)."""
    return sizing.optimal_tree(rates, max(budget - 1, 0), depth)


def _dp_one_over(rates, budget, depth):
    """Planted twin: one node too many."""
    return sizing.optimal_tree(rates, budget + 1, depth)


def test_dp_off_by_one_is_caught():
    assert _fails(check_dp_matches_brute_force, _dp_off_by_one)
    assert _fails(check_dp_matches_brute_force, _dp_one_over)


def test_tree_conversion_to_parents():
    tree = sizing.optimal_tree([0.6, 0.2, 0.1], 5)
    # the 5 most probable nodes: (0,) .6, (0,0) .36, (0,0,0) .216, (1,) .2, (0,0,0,0) .1296
    assert tree.choices == ((0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    assert tree.parents() == [-1, -1, 0, 2, 3]
    assert tree.choice_tree().ranks.tolist() == [0, 1, 0, 0, 0]
    assert sizing.optimal_tree([0.6, 0.2], 0) == sizing.SizedTree((), 1.0)


# ---- greedy (the shipped build, medusa.derive_choices) against the DP ----------------------------------

def test_greedy_equals_dp_when_rows_are_sorted():
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        for shape, depth in [((3,), None), ((4,), 3), ((3, 4), None), ((2, 3), 2), ((5, 2), 4)]:
            rates = _random_rates(rng, shape)
            for budget in (1, 2, 5, 9, 14):
                g = sizing.greedy_tree(rates, budget, depth)
                d = sizing.optimal_tree(rates, budget, depth)
                assert g.tau == pytest.approx(d.tau, rel=1e-12), (seed, shape, depth, budget)
                assert g.n_nodes == d.n_nodes


def test_greedy_differs_when_a_row_is_not_sorted():
    rates = [0.1, 0.6]  # rank 1 more likely than rank 0 (noisy measured accuracies)
    g, d = sizing.greedy_tree(rates, 1), sizing.optimal_tree(rates, 1)
    assert g.choices == ((1,),)  # skips rank 0: allowed for top-k (Medusa) verification ...
    assert d.choices == ((0,),)  # ... not under ordered (positional) children
    assert d.tau == pytest.approx(_brute_tau(rates, 1, 1))


# ---- 2. the cached measurement -------------------------------------------------------------------

class _FakeMeasure:
    def __init__(self):
        self.calls = 0

    def __call__(self, model, ns):
        self.calls += 1
        return {"ns": list(ns), "times_s": [0.01 + 0.001 * n for n in ns]}


def _fake_model(dtype=None):
    import torch

    model = torch.nn.Linear(2, 2, bias=False)
    model.config = SimpleNamespace(name_or_path="fake/tiny", hidden_size=2, max_position_embeddings=64)
    return model if dtype is None else model.to(dtype)


def check_cache(machine_cost_curve, tmp_path):
    import torch

    measure = _FakeMeasure()
    model = _fake_model()
    ns = [1, 2, 4]
    first = machine_cost_curve(model, ns=ns, measure=measure, cache_dir=tmp_path)
    assert measure.calls == 1 and first.ns == (1, 2, 4) and first.dtype == "float32"
    assert first.device == "cpu" and first.backend and first.machine
    again = machine_cost_curve(model, ns=ns, measure=measure, cache_dir=tmp_path)
    assert measure.calls == 1, "the second call measured again instead of reading the cache"
    assert again == first
    other = machine_cost_curve(_fake_model(torch.bfloat16), ns=ns, measure=measure, cache_dir=tmp_path)
    assert measure.calls == 2, "another dtype must be measured on its own"
    assert other.dtype == "bfloat16"
    machine_cost_curve(model, ns=[1, 2, 8], measure=measure, cache_dir=tmp_path)
    assert measure.calls == 3, "other ns must be measured"
    files = sorted(tmp_path.rglob("*.json"))
    assert len(files) == 3
    for f in files:  # corrupt every cached file: re-measured, not crashed on
        f.write_text("{not json")
    machine_cost_curve(model, ns=ns, measure=measure, cache_dir=tmp_path)
    assert measure.calls == 4, "a corrupt cache file must be measured over"
    machine_cost_curve(model, ns=ns, measure=measure, cache_dir=tmp_path)
    assert measure.calls == 4, "the re-measured curve must be cached again"
    machine_cost_curve(model, ns=ns, measure=measure, cache_dir=tmp_path, refresh=True)
    assert measure.calls == 5, "refresh=True must measure"


def test_machine_cost_curve_cache(tmp_path):
    check_cache(sizing.machine_cost_curve, tmp_path)


def test_cache_key_without_dtype_is_caught(tmp_path, monkeypatch):
    real = sizing.cost_curve_key

    def no_dtype(model, ns):  # planted twin: every dtype gets the same key (the float32 one)
        return {**real(model, ns), "dtype": "float32"}

    monkeypatch.setattr(sizing, "cost_curve_key", no_dtype)
    assert _fails(check_cache, sizing.machine_cost_curve, tmp_path)


def test_cache_that_never_reads_is_caught(tmp_path):
    def no_cache(model, ns, measure, cache_dir, refresh=False):  # planted twin
        return sizing.machine_cost_curve(model, ns=ns, measure=measure, cache_dir=cache_dir, refresh=True)

    assert _fails(check_cache, no_cache, tmp_path)


def test_cost_curve_key_names_what_the_curve_depends_on():
    import torch

    key = sizing.cost_curve_key(_fake_model(), [1, 2])
    assert {"machine", "torch", "device", "dtype", "backend", "model", "config", "ns"} <= set(key)
    assert key["torch"] == torch.__version__ and key["model"] == "fake/tiny"
    bigger = _fake_model()
    bigger.config.hidden_size = 4
    assert sizing.cost_curve_key(bigger, [1, 2])["config"] != key["config"]


# ---- 5. the size load_proposer drafts with -----------------------------------------------------

def _table(t1_run=T1):
    """A synthetic size table: a tree whose tau grows with its budget and costs little to draft,
    and a chain whose drafting costs a fifth of a plain step per token."""
    def tree(b):
        return {"tau": 1.0 + 0.9 * (1 - 0.8 ** b) / 0.2, "widths": {str(b + 1): 1.0},
                "draft_s": 0.1 * t1_run, "overhead_s": 0.0}

    def chain(k):
        return {"tau": 1.0 + sum(0.6 ** i for i in range(1, k + 1)), "widths": {str(k + 1): 1.0},
                "draft_s": 0.2 * t1_run * k, "overhead_s": 0.0}

    return {"meta": {"t1_s": t1_run, "plain_overhead_s": 0.0},
            "drafters": {"tree": {"kind": "tree", "sizes": {str(b): tree(b) for b in (1, 2, 4, 8, 16, 32)}},
                         "chain": {"kind": "chain", "sizes": {str(k): chain(k) for k in range(1, 9)}}}}


def check_size_for(size_for):
    table = _table()
    flat, steep = size_for("tree", FLAT, table), size_for("tree", STEEP, table)
    assert flat.size == 32, f"a flat curve should draft the biggest tree, got {flat.size}"
    assert steep.size == 0 and steep.speedup == 1.0, "T(n) = n T(1) pays for no tree: stand aside"
    mid = CostCurve(NS, [T1 * (1 + 0.05 * (n - 1)) for n in NS])
    assert 0 < size_for("tree", mid, table).size < 32
    # by hand: chain k = 1 on the flat curve: tau 1.6 over T(2) + 0.2 T(1)
    row = size_for("chain", FLAT, table).table[0]
    assert row.size == 1 and row.tokens_per_s == pytest.approx(1.6 / (1.2 * T1))
    # the run's seconds scale with T(1): the same table on a machine twice as slow picks the same size
    slow = CostCurve(NS, [2 * t for t in mid.times_s])
    assert size_for("tree", slow, table).size == size_for("tree", mid, table).size
    assert size_for("tree", slow, table).speedup == pytest.approx(size_for("tree", mid, table).speedup)


def test_size_for():
    check_size_for(sizing.size_for)


def test_size_for_that_ignores_drafting_time_is_caught():
    def no_draft_time(name, curve, table):  # planted twin: the drafter's time left out
        t = json.loads(json.dumps(table))
        for e in t["drafters"][name]["sizes"].values():
            e["draft_s"] = 0.0
        return sizing.size_for(name, curve, t)

    assert _fails(check_size_for, no_draft_time)


def test_size_for_that_never_stands_aside_is_caught():
    def always_drafts(name, curve, table):  # planted twin: the best size even when plain is faster
        choice = sizing.size_for(name, curve, table)
        return choice if choice.size else choice.__class__(**{**choice.__dict__, "size": choice.best_row.size})

    assert _fails(check_size_for, always_drafts)


def test_size_for_rejects_what_it_cannot_predict():
    with pytest.raises(ValueError, match="no measured sizes"):
        sizing.size_for("nope", FLAT, _table())
    with pytest.raises(ValueError, match="T\\(1\\)"):
        sizing.size_for("tree", FLAT, _table(t1_run=0.0))


def test_the_stored_table_covers_every_sized_drafter():
    from specdecode_ref.proposers import available_proposers, default_k

    table = sizing.stored_draft_sizes()
    sized = {n for n in available_proposers() if default_k(n) is not None}
    assert sized == set(table["drafters"]), "every proposer with a fixed default k must have measured sizes"
    for name, entry in table["drafters"].items():
        for size, e in entry["sizes"].items():
            assert e["tau"] >= 1.0 and e["draft_s"] >= 0 and e["overhead_s"] >= 0, (name, size)
            assert sum(e["widths"].values()) == pytest.approx(1.0, abs=1e-6), (name, size)
            assert max(int(n) for n in e["widths"]) <= int(size) + 1, (name, size)


def check_size_shrinks_with_batch(size_for):
    curve = CostCurve(NS, [T1 * (1 + 0.02 * (n - 1)) for n in NS])  # nearly flat for one request
    sizes = [size_for("tree", curve, _table(), batch_size=b).size for b in (1, 2, 4, 8)]
    assert sizes[0] > sizes[-1], f"a batch's steeper forward must shrink the tree, got {sizes}"
    assert sizes == sorted(sizes, reverse=True), sizes


def test_size_shrinks_with_batch():
    check_size_shrinks_with_batch(sizing.size_for)


def test_size_that_ignores_the_batch_is_caught():
    def one_request(name, curve, table, batch_size=1):  # planted twin: sizes every batch as one request
        return sizing.size_for(name, curve, table)

    assert _fails(check_size_shrinks_with_batch, one_request)


def check_margin(size_for):
    """A size predicted less than MIN_GAIN faster than plain decoding is not drafted."""
    t = _table()
    chain = t["drafters"]["chain"]["sizes"]
    gain = 1 + sizing.MIN_GAIN / 2  # predicted half the margin faster than plain, at k = 1 on the flat curve
    chain["1"] = {"tau": gain * 1.2, "widths": {"2": 1.0}, "draft_s": 0.2 * T1, "overhead_s": 0.0}
    for k in range(2, 9):
        chain[str(k)]["tau"] = 1.0
    choice = size_for("chain", FLAT, t)
    assert choice.best_row.size == 1 and choice.best_row.tokens_per_s > choice.plain_tokens_per_s
    assert choice.size == 0, "a gain inside the margin must stand aside"


def test_margin():
    check_margin(sizing.size_for)


def test_size_for_without_margin_is_caught(monkeypatch):
    monkeypatch.setattr(sizing, "MIN_GAIN", 0.0)  # planted twin: any predicted gain drafts
    real = sizing.size_for
    assert _fails(check_margin, lambda *a, **k: real(*a, **k))


def test_resolution_words_take_the_widest_interval_the_sentence_prints():
    """The stored check's resolution is half the widest interval describe_check prints, the old fixed
    size's and the paired ratio's included; taking only the chosen size's interval claimed ±1 %
    beside a printed ±2.3 %."""
    from specdecode_ref.measure import draft_sizes

    check = {"meta": {"prompts": 21}, "methods": {
        "early-exit": {"size": 0, "decode": [1.0, 0.99, 1.01], "predicted": 1.0},
        "early-exit@1": {"size": 1, "decode": [0.98, 0.96, 1.005], "chosen_over_fixed": [1.02, 0.999, 1.048]}}}
    words = draft_sizes.resolution_words(check, ["early-exit"])
    assert "±2 %" in words and "±1 %" not in words  # half of 1.048 - 0.999
    alone = {"meta": {"prompts": 21}, "methods": {"ngram": {"size": 8, "decode": [1.24, 1.13, 1.39], "predicted": 1.27}}}
    assert "±13 %" in draft_sizes.resolution_words(alone, ["ngram"])
