"""ngram_analysis: the brute-force match agrees with NgramProposer, and the offline replay
reproduces the engine's greedy bookkeeping exactly (tiny random Llama, fp32)."""
import random

import pandas as pd
import pytest
import torch

from specdecode_ref import autoregressive_generate, generate
from specdecode_ref.engine import ACCEPTED, BONUS, RECOVERED, TARGET
from specdecode_ref.measure.ngram_analysis import (GROUNDED, OPEN, Match, find_match, items_from_benchmark,
                                           replay_greedy, run_ablation, steps_frame, workload_kind)
from specdecode_ref.proposers import NgramProposer


def test_find_match_agrees_with_the_proposer():
    rng = random.Random(0)
    for trial in range(40):
        vocab = rng.choice([3, 6, 30])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 50))]
        k, min_n = rng.randrange(1, 7), rng.randrange(1, 3)
        max_n = min_n + rng.randrange(0, 4)
        occurrence = rng.choice(["recent", "first"])
        draft = NgramProposer(k=k, min_n=min_n, max_n=max_n, occurrence=occurrence).lookup(tokens)
        match = find_match(tokens, min_n, max_n, occurrence)
        if match is None:
            assert draft == [], trial
            continue
        assert tokens[match.start: match.end + 1] == tokens[len(tokens) - match.n:]
        assert draft == [tokens[match.source(j)] for j in range(k)], trial


def test_find_match_example_and_errors():
    tokens = [5, 1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3]
    assert find_match(tokens, 1, 3, "recent") == Match(n=3, start=5, end=7, period=4)
    assert find_match(tokens, 1, 3, "first") == Match(n=3, start=1, end=3, period=8)
    assert find_match([1, 2, 3], 1, 3) is None
    with pytest.raises(ValueError):
        find_match(tokens, 0, 2)
    with pytest.raises(ValueError):
        find_match(tokens, 1, 2, "last")


def test_replay_by_hand():
    prompt = [7, 1, 2, 3, 4, 5, 9]
    rep = replay_greedy(NgramProposer(k=3, min_n=1, max_n=4), prompt, [1, 2, 3, 4, 5, 6])
    # step 1: suffix (1,) occurred at index 1 -> draft 2 3 4, all accepted, bonus 5;
    # step 2: one token left in the budget -> no room for a draft, a plain step emits 6.
    assert [(s.drafted, s.accepted, s.emitted) for s in rep.steps] == [(3, 3, 4), (0, 0, 1)]
    assert rep.token_kinds == [TARGET, ACCEPTED, ACCEPTED, ACCEPTED, BONUS, TARGET]
    assert rep.sources == [-1, 2, 3, 4, -1, -1]
    assert rep.copied_from_prompt == 3
    assert rep.stats.steps == 2 and rep.stats.emitted == 5 and rep.stats.mean_accepted_length == 2.5
    assert rep.stats.per_position_acceptance == [1.0, 1.0, 1.0]
    assert rep.cost() == 2.0 and rep.modelled_speedup() == 2.5
    assert rep.cost(lambda n: 1.0 + 0.1 * n, draft_cost=0.5) == pytest.approx(1.3 + 1.0 + 2 * 0.5)
    with pytest.raises(ValueError):
        replay_greedy(NgramProposer(), [], [1])
    with pytest.raises(ValueError):
        replay_greedy(NgramProposer(), [1], [1, 2, 3], max_new_tokens=2)


def test_replay_without_sources_has_the_same_counters():
    prompt, cont = [7, 1, 2, 3, 4, 5, 9, 1, 2], [3, 4, 8, 1, 2, 3, 4, 5, 9]
    full = replay_greedy(NgramProposer(k=3), prompt, cont)
    fast = replay_greedy(NgramProposer(k=3), prompt, cont, track_sources=False)
    assert fast.stats.accepted_lengths == full.stats.accepted_lengths and fast.token_kinds == full.token_kinds
    assert all(s.match is None for s in fast.steps) and set(fast.sources) == {-1}
    assert any(s >= 0 for s in full.sources)


def test_replay_rejection_and_eos():
    # The draft 2 3 4 meets the continuation 2 3 0: two accepted, the target's 0 recovered.
    rep = replay_greedy(NgramProposer(k=3), [1, 2, 3, 4, 9], [1, 2, 3, 0], max_new_tokens=10)
    assert [(s.drafted, s.accepted, s.emitted) for s in rep.steps] == [(3, 2, 3)]
    assert rep.token_kinds == [TARGET, ACCEPTED, ACCEPTED, RECOVERED]
    # A continuation that ends (EOS) inside an accepted draft ends the run on that token.
    rep = replay_greedy(NgramProposer(k=3), [1, 2, 3, 4, 9], [1, 2, 3], max_new_tokens=10)
    assert [(s.drafted, s.accepted, s.emitted) for s in rep.steps] == [(3, 2, 2)]
    assert rep.token_kinds == [TARGET, ACCEPTED, ACCEPTED]


@pytest.mark.parametrize("cfg", [dict(k=4), dict(k=2, min_n=2, max_n=3), dict(k=6, max_n=2, occurrence="first"),
                                 dict(k=8, k_per_matched_token=2)])
def test_replay_equals_engine(tiny_model, cfg):
    gen = torch.Generator().manual_seed(3)
    for trial in range(3):
        base = torch.randint(0, 64, (6,), generator=gen)
        prompt = torch.cat([base, torch.randint(0, 64, (5,), generator=gen), base[:3]])  # something to copy
        plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=40)
        spec = generate(tiny_model, prompt, proposer=NgramProposer(**cfg), max_new_tokens=40)
        assert spec.tokens.tolist() == plain.tokens.tolist()
        rep = replay_greedy(NgramProposer(**cfg), prompt.tolist(), plain.tokens.tolist(), max_new_tokens=40)
        for name in ("drafted", "accepted", "steps", "emitted", "new_tokens", "accepted_lengths",
                     "drafted_per_position", "accepted_per_position"):
            assert getattr(rep.stats, name) == getattr(spec.stats, name), (cfg, trial, name)
        assert rep.token_kinds == spec.token_kinds
        # every accepted token equals the context token it is said to be copied from
        ctx = prompt.tolist() + plain.tokens.tolist()
        assert all(ctx[s] == t for s, t in zip(rep.sources, rep.tokens) if s >= 0)


def test_steps_frame():
    reps = [replay_greedy(NgramProposer(k=3), [7, 1, 2, 3, 4, 5, 9], [1, 2, 3, 4, 5, 6]),
            replay_greedy(NgramProposer(k=3), [1, 2, 3, 4, 9], [1, 2, 3, 0], max_new_tokens=10)]
    df = steps_frame(reps, [{"name": "a"}, {"name": "b"}])
    assert list(df["name"]) == ["a", "a", "b"]
    assert list(df["drafted"]) == [3, 0, 3] and list(df["accepted"]) == [3, 0, 2]
    assert list(df["match_n"]) == [1, 0, 1] and list(df["copied_from_prompt"]) == [True, False, True]
    with pytest.raises(ValueError):
        steps_frame(reps, [{"name": "a"}])


def test_replay_equals_engine_with_eos(tiny_model):
    prompt = torch.tensor([3, 9, 4, 3, 9, 4, 3, 9])
    plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=30, stop_on_eos=False)
    eos = plain.tokens.tolist()[12]  # pretend a token in the middle is EOS
    plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=30, eos_token_id=eos)
    spec = generate(tiny_model, prompt, proposer=NgramProposer(k=3), max_new_tokens=30, eos_token_id=eos)
    assert spec.tokens.tolist() == plain.tokens.tolist() and plain.finish_reason == "eos"
    rep = replay_greedy(NgramProposer(k=3), prompt.tolist(), plain.tokens.tolist(), max_new_tokens=30)
    assert rep.token_kinds == spec.token_kinds
    assert (rep.stats.steps, rep.stats.emitted, rep.stats.drafted) == (spec.stats.steps, spec.stats.emitted,
                                                                        spec.stats.drafted)


class _FakeTokenizer:
    def apply_chat_template(self, messages, **_):
        return [len(m["content"]) for m in messages] + [1, 2]


def test_items_and_ablation():
    workloads = {"rag_qa": [{"id": "r1", "messages": [{"role": "user", "content": "abc"}]}],
                 "qa": [{"id": "q1", "messages": [{"role": "user", "content": "abcd"}]}]}
    df = pd.DataFrame([
        {"category": "rag_qa", "prompt_id": "r1", "method": "plain", "token_ids": [3, 1, 2, 3, 1, 2]},
        {"category": "qa", "prompt_id": "q1", "method": "plain", "token_ids": [7, 8, 9, 10]},
        {"category": "qa", "prompt_id": "q1", "method": "ngram", "token_ids": [7, 8, 9, 10]},
    ])
    items = items_from_benchmark(df, workloads, _FakeTokenizer())
    assert [(i["category"], i["kind"], i["prompt"], i["continuation"]) for i in items] == [
        ("rag_qa", GROUNDED, [3, 1, 2], [3, 1, 2, 3, 1, 2]), ("qa", OPEN, [4, 1, 2], [7, 8, 9, 10])]
    assert workload_kind("code") == GROUNDED and workload_kind("math") == OPEN
    with pytest.raises(ValueError):
        items_from_benchmark(df, workloads, _FakeTokenizer(), method="hf")
    out = run_ablation(items, [{"k": 2}, {"k": 4, "max_n": 2}], by="kind")
    assert len(out) == 4 and set(out["kind"]) == {GROUNDED, OPEN}
    assert {"k", "max_n", "config", "tau", "acceptance_rate", "modelled_speedup", "draft_steps"} <= set(out.columns)
    row = out[(out["config"] == "k=2") & (out["kind"] == GROUNDED)].iloc[0]
    rep = replay_greedy(NgramProposer(k=2), [3, 1, 2], [3, 1, 2, 3, 1, 2])
    assert row["tau"] == rep.stats.mean_accepted_length and row["steps"] == rep.stats.steps
    assert row["modelled_speedup"] == pytest.approx(rep.modelled_speedup())
    open_row = out[(out["config"] == "k=2") & (out["kind"] == OPEN)].iloc[0]
    assert open_row["drafted"] == 0 and open_row["tau"] == 1.0 and open_row["modelled_speedup"] == 1.0
    with pytest.raises(ValueError):
        run_ablation([], [{"k": 2}])
    with pytest.raises(ValueError):
        run_ablation(items, [])
