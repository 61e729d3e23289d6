"""measure/harness/compare.py on a tiny random Llama: no timing thresholds, only counts and identities."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from specdecode_ref import generate
from specdecode_ref.measure.harness import compare
from specdecode_ref.measure.harness.compare import (decode_speedup, first_mismatch, method_stats,
                                            method_table, probe_step, results_from_benchmark, run_interleaved)
from specdecode_ref.measure.harness.timing import decode_rate
from specdecode_ref.metrics import SpecStats
from specdecode_ref.proposers import NgramProposer, Proposer
from specdecode_ref.proposers.base import Draft
from specdecode_ref.sampling import SamplingParams


class FixedTree(Proposer):
    """Drafts the same 4-node tree at every step (the tokens need not be good)."""

    def __init__(self):
        super().__init__(k=4)
        self.calls = 0

    def propose(self, state):
        self.calls += 1
        base = state.token_list[-1]
        tokens = torch.tensor([(base + d) % 64 for d in (1, 2, 3, 4)])
        return Draft(tokens, None, torch.tensor([-1, -1, 0, 2]))


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2 and first_mismatch([1, 2, 3], [1, 2]) == 2
    assert first_mismatch([], []) is None
    assert first_mismatch(torch.tensor([4, 5]).tolist(), (4, 6)) == 1


def _stats(emitted, wall, prefill, drafted=0, accepted=0):
    s = SpecStats()
    s.record_step(drafted, accepted, emitted)
    s.emitted, s.new_tokens, s.wall_time_s, s.prefill_time_s = emitted, emitted + 1, wall, prefill
    return s


def test_decode_rate_excludes_the_prefill():
    plain, spec = _stats(10, 1.5, 0.5), _stats(10, 1.0, 0.5)
    assert decode_rate(plain) == pytest.approx(10.0)
    assert decode_rate(spec) == pytest.approx(20.0)
    assert decode_speedup(spec, plain) == pytest.approx(2.0)


@pytest.fixture
def rounds_as_scheduled(monkeypatch):
    """Switch off the protocol's spike rule: on the tiny model a run takes milliseconds, so two rounds
    often differ by more than its factor and an extra round would change how many runs a test sees.
    The rule itself is tested in test_protocol.py and, through run_interleaved, below."""
    from specdecode_ref.measure.harness import protocol

    monkeypatch.setattr(protocol, "wants_another_round", lambda seconds: False)
    monkeypatch.setattr(protocol, "outliers", lambda kept: [])


def test_run_interleaved_runs_every_method_on_every_prompt_in_order(tiny_model, rounds_as_scheduled):
    prompts = [torch.tensor([1, 2, 3, 1, 2]), torch.tensor([7, 8, 9, 7, 8, 9])]
    calls = []

    class Counting(NgramProposer):
        def begin(self, state):
            calls.append(("ngram", len(state.token_list)))
            super().begin(state)

    res = run_interleaved(tiny_model, prompts, {"plain": None, "ngram": Counting(k=3)}, max_new_tokens=12,
                          warmup=1, repeats=2)
    assert list(res) == ["plain", "ngram"] and all(len(v) == 2 for v in res.values())
    # warm-up once, then two repeats per prompt, prompt by prompt (begin sees prompt + first token)
    assert [n for _, n in calls] == [6, 6, 6, 7, 7]
    for plain, spec in zip(res["plain"], res["ngram"]):
        assert plain.tokens.tolist() == spec.tokens.tolist()  # greedy fp32: lossless
    table = method_table(res)
    assert list(table.index) == ["plain", "ngram"]
    assert table.loc["plain", "speedup"] == pytest.approx(1.0)
    assert table.loc["plain", "τ"] == pytest.approx(1.0)
    assert table.loc["ngram", "τ"] == pytest.approx(
        sum(r.stats.emitted for r in res["ngram"]) / sum(r.stats.steps for r in res["ngram"]))
    assert (table["tokens"] == 24).all() and (table["prompts"] == 2).all()
    with_c = method_table(res, t1_s=0.01)
    assert "c per step" in with_c and with_c.loc["plain", "c per step"] == 0.0
    with pytest.raises(ValueError, match="reference"):
        method_table({"ngram": res["ngram"]})


def test_method_stats_merges_benchmark_rows():
    a, b, c = _stats(4, 1, 0.1, 3, 2), _stats(6, 1, 0.1, 5, 5), _stats(3, 1, 0.1)
    df = pd.DataFrame({"method": ["m", "m", "plain"], "category": ["x", "y", "x"],
                       "prompt_id": ["p1", "p2", "p1"], "stats": [a, b, c]})
    assert method_stats(df, "m").accepted == 7
    assert method_stats(df, "m", category="y").accepted == 5
    assert method_stats(df, "m", prompt_ids=["p1"]).drafted == 3
    with pytest.raises(ValueError):
        method_stats(df, "nope")
    res = results_from_benchmark(df, prompt_ids=["p1"])
    assert list(res) == ["m", "plain"] and res["m"] == [a]


def test_probe_step_is_the_engines_first_tree_step(tiny_model):
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    prop = FixedTree()
    probe = probe_step(tiny_model, prop, prompt)
    assert "propose" not in prop.__dict__  # the proposer is restored
    assert probe.context[:-1] == prompt.tolist() and probe.root == probe.context[-1]
    assert probe.draft.parents.tolist() == [-1, -1, 0, 2]
    assert probe.logits.shape == (5, 64) and probe.probs.shape == (5, 64)
    # The captured logits equal a fresh causal forward along each root-to-node path.
    ctx = probe.context
    for node in range(len(probe.draft.tokens)):
        path = [node]
        while path[-1] >= 0 and probe.draft.parents[path[-1]] >= 0:
            path.append(int(probe.draft.parents[path[-1]]))
        ids = ctx + [int(probe.draft.tokens[i]) for i in reversed(path)]
        with torch.no_grad():
            ref = tiny_model(input_ids=torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(probe.logits[node + 1], ref, atol=1e-4, rtol=1e-4)
    # The root's greedy verdict is what the engine would have done with the same step.
    out = generate(tiny_model, prompt, proposer=FixedTree(), max_new_tokens=2)
    assert out.tokens[0].item() == probe.root
    assert out.tokens[1].item() == int(probe.logits[0].argmax())
    # Sampling parameters process the probabilities like the engine does.
    hot = probe_step(tiny_model, FixedTree(), prompt, sampling=SamplingParams(temperature=0.7), seed=0)
    assert torch.allclose(hot.probs.sum(-1), torch.ones(5))


def test_probe_step_refuses_when_nothing_is_drafted(tiny_model):
    class Silent(Proposer):
        def propose(self, state):
            return Draft.empty(torch.device("cpu"))

    with pytest.raises(RuntimeError, match="non-empty draft"):
        probe_step(tiny_model, Silent(k=2), torch.tensor([1, 2, 3]))


def test_bench_uses_the_shared_first_mismatch():
    from specdecode_ref.measure.harness import bench

    assert bench.first_mismatch is compare.first_mismatch


def test_a_repeat_does_not_let_suffix_decoding_draft_its_own_first_answer(tiny_model):
    """Suffix decoding remembers earlier outputs. Timed twice on one prompt, the second run must
    start from the drafter's state before the prompt: the same τ as the first run, not a near-perfect
    copy of its own answer. Planted twin: reusing the drafter as it is after the first run."""
    from specdecode_ref.engine import generate
    from specdecode_ref.proposers.suffix import SuffixProposer

    prompt = torch.tensor([5, 9, 2, 7, 3, 11, 4])
    res = run_interleaved(tiny_model, [prompt], {"suffix": SuffixProposer(k=8)}, max_new_tokens=24, warmup=0,
                          repeats=3)
    fresh = generate(tiny_model, prompt, proposer=SuffixProposer(k=8), max_new_tokens=24)
    assert res["suffix"][0].stats.steps == fresh.stats.steps

    leaky = SuffixProposer(k=8)
    first = generate(tiny_model, prompt, proposer=leaky, max_new_tokens=24)
    again = generate(tiny_model, prompt, proposer=leaky, max_new_tokens=24)
    assert again.stats.steps < first.stats.steps  # what the repeats would have measured without the copy


def _named(label, order):
    """An n-gram proposer that appends ``label`` to ``order`` each time a run begins."""
    class Named(NgramProposer):
        def begin(self, state):
            order.append(label)
            super().begin(state)

    return Named(k=2)


def test_repeats_alternate_the_order_of_the_methods(tiny_model, rounds_as_scheduled):
    """Every other repeat runs the methods in reverse, so no method always runs first on a prompt."""
    order = []

    run_interleaved(tiny_model, [torch.tensor([1, 2, 3, 1, 2])], {"a": _named("a", order), "b": _named("b", order)},
                    max_new_tokens=4, warmup=0, repeats=3)
    assert order == ["a", "b", "b", "a", "a", "b"]


@pytest.mark.parametrize("twin", [None, "never_retime"])
def test_a_method_whose_rounds_disagree_is_timed_again(tiny_model, monkeypatch, twin):
    """Protocol rule 3 inside run_interleaved: a method whose rounds disagree gets another round after
    the scheduled ones, and the run kept is the one kept_index picks. The rule is forced here (the
    tiny model's timings are too short to spike on purpose). Planted twin: a loop that never re-times."""
    from specdecode_ref.measure.harness import protocol

    asked = []

    def disagree_once(seconds):
        asked.append(len(seconds))
        return twin is None and len(asked) == 1  # method "a" once, after its two scheduled rounds

    monkeypatch.setattr(protocol, "wants_another_round", disagree_once)
    monkeypatch.setattr(protocol, "outliers", lambda kept: [])
    order = []

    res = run_interleaved(tiny_model, [torch.tensor([1, 2, 3, 1, 2])], {"a": _named("a", order), "b": _named("b", order)},
                          max_new_tokens=4, warmup=0, repeats=2)
    retimed = order == ["a", "b", "b", "a", "a"]
    assert retimed == (twin is None), order
    assert len(res["a"]) == len(res["b"]) == 1
