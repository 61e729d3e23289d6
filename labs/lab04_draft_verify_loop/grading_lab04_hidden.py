"""Lab 4 grading tests (hidden): the edge cases the notebook does not show."""
from __future__ import annotations

import pytest
import torch

from grading_lab04 import (VOCAB, CountForwards, as_ids, expected_schedule, make_prompt, model, plain, run,
                           scripted_run)
from specdecode_ref import kv
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(2)
@pytest.mark.parametrize("draft", ["close", "twin"])
def test_max_new_tokens_one(lab, draft):
    """max_new_tokens=1: exactly one token (the target's), one step, one target forward."""
    t, d = model("target"), model(draft)
    p = make_prompt(30)
    result, counts, checker = run(lab, t, d, p, 4, 1, check=True)
    assert as_ids(result["tokens"]) == plain("target", p, 1)
    assert counts[t] == 1 == result["target_forwards"] == len(result["accepted"])
    assert list(result["drafted"]) == [1], "with one token left, draft at most one"
    assert not checker.problems, "; ".join(checker.problems[:3])


@points(2)
@pytest.mark.parametrize("draft", ["close", "twin"])
def test_k_larger_than_budget(lab, draft):
    """k=7 with budgets 2, 3, 5 and 8: never draft past the budget, stop at exactly max_new_tokens."""
    t, d = model("target"), model(draft)
    for n in (2, 3, 5, 8):
        p = make_prompt(40 + n)
        result, counts, checker = run(lab, t, d, p, 7, n, check=True)
        assert as_ids(result["tokens"]) == plain("target", p, n), f"max_new_tokens={n}"
        drafted, _, done = expected_schedule(result["accepted"], 7, n)
        assert list(result["drafted"]) == drafted, f"max_new_tokens={n}: drafted {result['drafted']}, expected {drafted}"
        assert done == n and counts[d] == sum(drafted) == result["draft_forwards"]
        assert not checker.problems, f"max_new_tokens={n}: " + "; ".join(checker.problems[:3])
        if draft == "twin":  # everything accepted: the last bonus token is dropped when it does not fit
            assert len(result["accepted"]) == -(-n // 8)


@points(2)
@pytest.mark.parametrize("draft", ["shallow", "deep"])
def test_draft_with_other_depth(lab, draft):
    """A draft with 1 or 3 layers (the target has 2): its own cache, same output, same invariant."""
    t, d = model("target"), model(draft)
    for k, n in ((2, 19), (5, 24)):
        p = make_prompt(50 + k)
        result, _, checker = run(lab, t, d, p, k, n, check=True)
        assert as_ids(result["tokens"]) == plain("target", p, n), f"k={k}"
        assert not checker.problems, f"k={k}: " + "; ".join(checker.problems[:3])


@points(2)
def test_every_acceptance_length_k7(lab):
    """The scripted draft with k=7: steps accept 7, 0, 3, 6, 1, 7, 5, 2, 4 drafts."""
    script = [7, 0, 3, 6, 1, 7, 5, 2, 4]
    result, want, checker = scripted_run(lab, script, 7, prompt_seed=60)
    assert as_ids(result["tokens"]) == want
    assert list(result["accepted"]) == script, f"accepted per step {list(result['accepted'])}, scripted {script}"
    assert not checker.problems, "; ".join(checker.problems[:3])


@points(1)
def test_scripted_k1_alternating(lab):
    """k=1, accepting and rejecting in turn: the draft cache is one behind after every full accept."""
    script = [1, 0, 1, 1, 0, 0, 1, 0]
    result, want, checker = scripted_run(lab, script, 1, prompt_seed=61)
    assert as_ids(result["tokens"]) == want
    assert list(result["accepted"]) == script
    assert not checker.problems, "; ".join(checker.problems[:3])


@points(1)
def test_long_generation(lab):
    """60 tokens with k=3 and the close draft: equal to plain greedy, invariant at every step."""
    t, d = model("target"), model("close")
    p = make_prompt(70, length=12)
    result, _, checker = run(lab, t, d, p, 3, 60, check=True)
    assert as_ids(result["tokens"]) == plain("target", p, 60)
    assert not checker.problems, "; ".join(checker.problems[:3])


@points(1)
def test_prompt_of_one_token_and_tensor_input(lab):
    """A one-token prompt, and the prompt as a 1-D LongTensor, work like a list; the input is not modified."""
    t, d = model("target"), model("close")
    result, _, _ = run(lab, t, d, [17], 3, 9)
    assert as_ids(result["tokens"]) == plain("target", [17], 9)
    p = make_prompt(71)
    pt = torch.tensor(p)
    result = lab.speculative_greedy(t, d, pt, 3, 9)
    assert as_ids(result["tokens"]) == plain("target", p, 9)
    assert pt.tolist() == p


@points(1)
def test_bad_input_more(lab):
    """ValueError for max_new_tokens < 1, an empty prompt, and empty pending ids."""
    t, d, p = model("target"), model("close"), make_prompt(72)
    with pytest.raises(ValueError):
        lab.speculative_greedy(t, d, p, 3, 0)
    with pytest.raises(ValueError):
        lab.speculative_greedy(t, d, [], 3, 5)
    with pytest.raises(ValueError):
        lab.draft_tokens(d, kv.new_cache(d), [], 2)
    with pytest.raises(ValueError):
        lab.verify_greedy(t, kv.new_cache(t), [], [1, 2])


@points(1)
def test_verify_empty_draft_and_rollback_to_zero(lab):
    """verify_greedy with no drafts is one plain decoding step; rollback(cache, 0) empties a cache."""
    t = model("target")
    p = make_prompt(73)
    cache = kv.new_cache(t)
    with CountForwards(lab, t) as c:
        a, emitted = lab.verify_greedy(t, cache, p, [])
    assert c[t] == 1 and (int(a), as_ids(emitted)) == (0, plain("target", p, 1))
    assert kv.cache_len(cache) == len(p)
    lab.rollback(cache, 0)
    assert kv.cache_len(cache) == 0
    a, emitted = lab.verify_greedy(t, cache, p, plain("target", p, 2))
    assert (int(a), as_ids(emitted)) == (2, plain("target", p, 3)), "a cache rolled back to 0 must be reusable"
    assert VOCAB == t.config.vocab_size
