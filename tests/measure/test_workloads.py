"""The drafter-training and held-out prompt sets: load, well-formed, balanced, and disjoint from the benchmark
(and, for the held-out set, from the training prompts)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter

import pytest

from specdecode_ref.measure.harness import workloads as wl
from specdecode_ref.measure.harness.workloads import (CATEGORIES, HELDOUT_PATH, TRAIN_PROMPTS_PATH, load_heldout,
                                              load_training_prompts, load_workloads, training_conversations)

NGRAM = 12
_WORD = re.compile(r"\w+")


def _words(text: str) -> list:
    return _WORD.findall(text.lower())


def _ngrams(text: str, n: int = NGRAM) -> set:
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def _norm(text: str) -> str:
    return " ".join(_words(text))


def _user_texts(prompts: dict) -> list:
    return [m["content"] for items in prompts.values() for p in items for m in p["messages"] if m["role"] == "user"]


def _all_grams(prompts: dict) -> set:
    """Every 12-word window of every message (user and assistant) of a prompt set."""
    return {g for items in prompts.values() for p in items for m in p["messages"] for g in _ngrams(m["content"])}


def _assert_no_shared_window(prompts: dict, reference_grams: set) -> None:
    assert reference_grams  # the check is not vacuous
    for items in prompts.values():
        for p in items:
            for m in p["messages"]:
                shared = _ngrams(m["content"]) & reference_grams
                assert not shared, (p["id"], " ".join(next(iter(shared))))


@pytest.fixture(scope="module")
def train():
    return load_training_prompts()


@pytest.fixture(scope="module")
def bench():
    return load_workloads()


def test_loads_all_categories(train):
    assert list(train) == CATEGORIES
    for name, items in train.items():
        assert len(items) >= 90, (name, len(items))
    assert sum(len(v) for v in train.values()) >= 600


def test_ids_unique_and_named(train):
    ids = [p["id"] for items in train.values() for p in items]
    assert len(ids) == len(set(ids))
    for name, items in train.items():
        for p in items:
            assert re.fullmatch(rf"train-{name}-\d{{3}}", p["id"]), p["id"]


def test_messages_alternate_and_end_with_user(train):
    for name, items in train.items():
        for p in items:
            msgs = p["messages"]
            assert msgs and msgs[-1]["role"] == "user", p["id"]
            for k, m in enumerate(msgs):
                assert set(m) == {"role", "content"}, p["id"]
                assert m["role"] == ("user" if k % 2 == 0 else "assistant"), p["id"]
                assert isinstance(m["content"], str) and m["content"].strip(), p["id"]
            if name == "multi_turn":
                assert len(msgs) >= 3, p["id"]
            else:
                assert len(msgs) == 1, p["id"]


def test_prompt_texts_unique(train):
    texts = Counter(repr(p["messages"]) for items in train.values() for p in items)
    assert max(texts.values()) == 1


def test_no_verbatim_overlap_with_benchmark(train, bench):
    train_norm = [_norm(t) for t in _user_texts(train)]
    bench_units = set()
    for t in _user_texts(bench):
        bench_units.add(_norm(t))
        # every benchmark passage / paragraph of a substantial size
        bench_units.update(_norm(p) for p in t.split("\n\n") if len(_words(p)) >= 8)
    for unit in bench_units:
        for t in train_norm:
            assert unit != t and unit not in t, unit[:80]


def test_no_shared_12_word_window_with_benchmark(train, bench):
    bench_grams = set()
    for t in _user_texts(bench):
        bench_grams |= _ngrams(t)
    _assert_no_shared_window(train, bench_grams)


def test_load_training_prompts_arguments():
    sub = load_training_prompts("qa,code", per_category=3)
    assert list(sub) == ["qa", "code"] and all(len(v) == 3 for v in sub.values())
    assert sub["qa"] == load_training_prompts(["qa"])["qa"][:3]
    sub["qa"][0]["messages"][0]["content"] = "changed"
    assert load_training_prompts(["qa"], per_category=1)["qa"][0]["messages"][0]["content"] != "changed"
    with pytest.raises(ValueError):
        load_training_prompts(["nope"])
    with pytest.raises(ValueError):
        load_training_prompts(per_category=0)


def test_missing_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(wl, "TRAIN_PROMPTS_PATH", tmp_path / "absent.json")
    wl._raw_train.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="make_train_prompts"):
            load_training_prompts()
    finally:
        monkeypatch.undo()
        wl._raw_train.cache_clear()


def test_training_conversations_round_robin(train):
    convs = training_conversations()
    assert len(convs) == sum(len(v) for v in train.values())
    expected, i = [], 0
    while any(i < len(v) for v in train.values()):
        expected += [v[i]["messages"] for v in train.values() if i < len(v)]
        i += 1
    assert convs == expected
    k = len(CATEGORIES)
    assert convs[:k] == [train[c][0]["messages"] for c in CATEGORIES]
    assert convs[k:2 * k] == [train[c][1]["messages"] for c in CATEGORIES]
    assert training_conversations() == convs  # fixed order


def test_generator_reproduces_file():
    path = TRAIN_PROMPTS_PATH.parent / "make_train_prompts.py"
    spec = importlib.util.spec_from_file_location("make_train_prompts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.render(mod.build()) == TRAIN_PROMPTS_PATH.read_text(encoding="utf-8")


def test_training_conversations_max_chars_keeps_short_chats_balanced(train):
    short = training_conversations(max_chars=200)
    assert short and all(sum(len(m["content"]) for m in conv) <= 200 for conv in short)
    full = training_conversations()
    assert len(short) < len(full) and all(conv in full for conv in short[:20])
    with pytest.raises(ValueError, match="max_chars"):
        training_conversations(max_chars=0)


# ---------------------------------------------------------------------------------------------
# the held-out set (data/heldout.json): nothing is tuned or trained on it
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def heldout():
    return load_heldout()


def test_heldout_has_every_category_with_six_prompts(heldout):
    assert list(heldout) == CATEGORIES
    assert {name: len(items) for name, items in heldout.items()} == {name: 6 for name in CATEGORIES}


def test_heldout_ids_unique_and_named(heldout):
    ids = [p["id"] for items in heldout.values() for p in items]
    assert len(ids) == len(set(ids)) == 42
    for name, items in heldout.items():
        assert [p["id"] for p in items] == [f"heldout-{name}-{k:02d}" for k in range(1, 7)]


def test_heldout_messages_alternate_and_end_with_user(heldout):
    texts = Counter(repr(p["messages"]) for items in heldout.values() for p in items)
    assert max(texts.values()) == 1
    for name, items in heldout.items():
        for p in items:
            msgs = p["messages"]
            assert msgs and msgs[-1]["role"] == "user", p["id"]
            for k, m in enumerate(msgs):
                assert set(m) == {"role", "content"}, p["id"]
                assert m["role"] == ("user" if k % 2 == 0 else "assistant"), p["id"]
                assert isinstance(m["content"], str) and m["content"].strip(), p["id"]
            assert (len(msgs) >= 3) if name == "multi_turn" else (len(msgs) == 1), p["id"]


def test_heldout_shares_no_12_word_window_with_benchmark_or_training(heldout, bench, train):
    _assert_no_shared_window(heldout, _all_grams(bench))
    _assert_no_shared_window(heldout, _all_grams(train))


def test_load_heldout_arguments():
    sub = load_heldout("math,rag_qa", per_category=2)
    assert list(sub) == ["math", "rag_qa"] and all(len(v) == 2 for v in sub.values())
    assert sub["math"] == load_heldout(["math"])["math"][:2]
    sub["math"][0]["messages"][0]["content"] = "changed"
    assert load_heldout(["math"], per_category=1)["math"][0]["messages"][0]["content"] != "changed"
    with pytest.raises(ValueError, match="unknown workload category 'nope'"):
        load_heldout(["nope"])
    with pytest.raises(ValueError, match="no categories"):
        load_heldout([])
    with pytest.raises(ValueError, match="per_category"):
        load_heldout(per_category=0)


def test_heldout_missing_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(wl, "HELDOUT_PATH", tmp_path / "absent.json")
    wl._raw_heldout.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="make_heldout_prompts"):
            load_heldout()
    finally:
        monkeypatch.undo()
        wl._raw_heldout.cache_clear()


def test_heldout_generator_check_passes():
    script = HELDOUT_PATH.parent / "make_heldout_prompts.py"
    proc = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
