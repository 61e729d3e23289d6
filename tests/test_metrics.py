import pytest

from specdecode_ref.metrics import SpecStats


def test_counters_and_both_per_position_rates():
    s = SpecStats()
    s.record_step(4, 4, 5)  # all accepted + bonus
    s.record_step(4, 1, 2)  # rejected at position 1
    s.record_step(0, 0, 1)  # nothing drafted
    s.record_step(2, 0, 1)  # rejected at position 0
    assert (s.steps, s.drafted, s.accepted, s.emitted, s.drafting_steps) == (4, 10, 5, 9, 3)
    assert s.acceptance_rate == pytest.approx(0.5)
    assert s.mean_accepted_length == pytest.approx(9 / 4)  # tau: per target forward
    assert s.vllm_mean_acceptance_length == pytest.approx(1 + 5 / 3)  # per drafting step
    # Survival (vLLM): position 0 accepted in 2 of 3 drafts; position 1 in 1 of 3; 2 and 3: 1 of 2.
    assert s.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    # Conditional: position 1 reached twice (accepted once); positions 2, 3 reached once, accepted.
    assert s.per_position_conditional == pytest.approx([2 / 3, 1 / 2, 1.0, 1.0])


def test_merge_adds_everything():
    a, b = SpecStats(), SpecStats()
    a.record_step(3, 2, 3)
    b.record_step(5, 5, 6)
    m = a.merge(b)
    assert (m.steps, m.drafted, m.accepted, m.drafting_steps) == (2, 8, 7, 2)
    assert m.drafted_per_position == [2, 2, 2, 1, 1]
    assert m.reached_per_position == [2, 2, 2, 1, 1]
    assert m.accepted_lengths == [2, 5] and m.draft_lengths == [3, 5]


def test_merge_stats_pools_any_number_of_runs():
    from specdecode_ref.metrics import merge_stats

    runs = []
    for steps in ([(3, 2, 3)], [(5, 5, 6), (2, 0, 1)], []):
        s = SpecStats()
        for step in steps:
            s.record_step(*step)
        s.wall_time_s, s.prefill_time_s, s.new_tokens = 1.0, 0.25, sum(e for _, _, e in steps) + 1
        runs.append(s)
    m = merge_stats(runs)
    assert (m.steps, m.drafted, m.accepted, m.emitted) == (3, 10, 7, 10)
    assert m.acceptance_rate == pytest.approx(7 / 10)  # pooled, not the mean of per-run rates
    assert m.wall_time_s == pytest.approx(3.0) and m.prefill_time_s == pytest.approx(0.75)
    assert m.accepted_lengths == [2, 5, 0] and m.draft_lengths == [3, 5, 2]
    assert m.per_position_conditional == pytest.approx(runs[0].merge(runs[1]).per_position_conditional)
    empty = merge_stats([])
    assert empty.steps == 0 and empty.tau == 0.0
