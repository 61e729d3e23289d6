"""The large corpus: its plan is well formed, its chats are built as documented, and the committed
token ids never contain a benchmark prompt (a drafter must not be scored on text it trained on)."""
import numpy as np
import pytest
import torch

from specdecode_ref.measure.harness.workloads import load_workloads, training_conversations
from specdecode_ref.training import corpus_plan, distill
from specdecode_ref.training.corpus_plan import FULL_PLAN, Pass, check_plan

WINDOW = 16  # tokens: longer than any phrase two unrelated texts share by chance...
DISTINCT = 10  # ...unless it is a counting pattern ("1, 2, 3, 4, ..."), which any two texts may share


def test_the_plans_are_well_formed():
    check_plan(FULL_PLAN)
    check_plan(corpus_plan.BASE_PLAN)
    assert len(FULL_PLAN) == 16 and {p.source for p in FULL_PLAN} == {"base", "follow_up", "reuse"}


@pytest.mark.parametrize("plan,match", [
    ((Pass("a", "follow_up", from_pass="b"),), "no earlier pass"),
    ((Pass("a"), Pass("a", temperature=0.7)), "two passes"),
    ((Pass("a", source="web"),), "unknown source"),
    ((Pass("a", temperature=0.7, top_p=0.0),), "top_p"),
])
def test_a_bad_plan_is_refused(plan, match):
    with pytest.raises(ValueError, match=match):
        check_plan(plan)


def test_follow_ups_extend_the_chat_with_the_targets_answer():
    convs = [[{"role": "user", "content": "Q1"}], [{"role": "user", "content": "Q2"}]]
    out = corpus_plan.follow_up_chats(convs, ["A1", "A2"], seed=0)
    assert [m["role"] for m in out[0]] == ["user", "assistant", "user"]
    assert out[1][1]["content"] == "A2" and out[1][2]["content"] in corpus_plan.FOLLOW_UPS
    assert out == corpus_plan.follow_up_chats(convs, ["A1", "A2"], seed=0)  # seeded
    assert convs[0] == [{"role": "user", "content": "Q1"}]  # the input is not modified


def test_reuse_keeps_long_answers_only():
    out = corpus_plan.reuse_chats(["short", "x" * 300], seed=0)
    assert len(out) == 1 and "x" * 300 in out[0][0]["content"]


def test_token_ids_round_trip(tmp_path):
    pairs = [(torch.tensor([1, 2, 3]), torch.tensor([4, 5])), (torch.tensor([7]), torch.tensor([49151, 2]))]
    path = distill.save_token_ids(tmp_path / "c.npz", pairs, [0, 1], [0, 3], {"plan": "x"})
    back = distill.load_token_ids(path)
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(pairs, back["pairs"]))
    assert back["groups"] == [0, 1] and back["passes"] == [0, 3] and back["meta"] == {"plan": "x"}
    with pytest.raises(ValueError, match="uint16"):
        distill.save_token_ids(tmp_path / "d.npz", [(torch.tensor([70000]), torch.tensor([1]))], [0], [0])


def test_the_held_out_split_keeps_a_prompts_answers_together():
    groups = [i % 50 for i in range(400)]
    train, held = distill.split_by_group(groups, 0.1, seed=0)
    assert sorted(train + held) == list(range(400))
    assert not {groups[i] for i in train} & {groups[i] for i in held} and len({groups[i] for i in held}) == 5


def _windows(ids: np.ndarray, n: int) -> set:
    if len(ids) < n:
        return set()
    view = np.lib.stride_tricks.sliding_window_view(ids.astype(np.int64), n)
    return set(map(bytes, view.astype(np.uint16)))


def _telling(windows: set) -> set:
    return {w for w in windows if len(set(np.frombuffer(w, dtype=np.uint16).tolist())) >= DISTINCT}


def test_the_committed_corpus_holds_no_benchmark_prompt(embedded):
    _, tok = embedded
    saved = np.load(distill.DEFAULT_IDS_PATH)
    corpus = _windows(saved["tokens"], WINDOW)
    assert len(saved["lengths"]) > 10_000 and (saved["lengths"] - saved["starts"]).sum() > 1_500_000
    checked = 0
    for prompts in load_workloads().values():
        for prompt in prompts:
            for msg in prompt["messages"]:
                ids = np.array(tok(msg["content"], add_special_tokens=False)["input_ids"])
                hits = _telling(_windows(ids, WINDOW)) & corpus
                assert not hits, f"benchmark prompt {prompt['id']} shares {len(hits)} {WINDOW}-token windows"
                checked += len(ids) >= WINDOW
    assert checked > 50
    # and the check can fail: a training prompt's text is found
    train_text = training_conversations()[0][0]["content"]
    assert _telling(_windows(np.array(tok(train_text, add_special_tokens=False)["input_ids"]), WINDOW)) & corpus


def test_data_subset_keeps_first_turn_answers_of_a_share_of_prompts():
    """``data --prompt-fraction F --first-turn``: whole prompts (every kept answer's prompt is chosen,
    every first-turn answer of a chosen prompt is kept), the same choice for the same seed."""
    from types import SimpleNamespace

    from specdecode_ref.training.cli import FIRST_TURN_PASSES, _data_subset

    passes = list(FIRST_TURN_PASSES) + ["follow_greedy", "reuse_t07"]
    groups = [f"p{g}" for g in range(20) for _ in passes]
    saved = {"groups": groups, "passes": [i for _ in range(20) for i in range(len(passes))],
             "meta": {"passes": passes}}
    every = list(range(len(groups)))
    args = SimpleNamespace(prompt_fraction=0.25, first_turn=True, subset_seed=1)
    keep, what = _data_subset(saved, every, args)
    chosen = {groups[i] for i in keep}
    assert len(chosen) == 5 and "5 of 20 training prompts" in what and "first-turn" in what
    assert keep == [i for i in every if groups[i] in chosen and passes[saved["passes"][i]] in FIRST_TURN_PASSES]
    assert _data_subset(saved, every, args) == (keep, what)
    assert _data_subset(saved, every, SimpleNamespace(prompt_fraction=1.0, first_turn=False, subset_seed=1)) == (every, "")
    with pytest.raises(SystemExit, match="prompt-fraction"):
        _data_subset(saved, every, SimpleNamespace(prompt_fraction=0.0, first_turn=True, subset_seed=1))
