"""``load_proposer(name, model)`` without k drafts at the size predicted fastest on this machine;
an explicit k wins; plain decoding predicted faster makes the drafter stand aside; the choice is
said in the repr and logged once; and every size the table can choose decodes exactly what plain
greedy decoding does."""
from __future__ import annotations

import logging

import pytest
import torch

from specdecode_ref import autoregressive_generate, chat_ids, generate, sizing
from specdecode_ref.measure.harness.workloads import load_workloads
from specdecode_ref.proposers import StandAside, default_k, load_proposer
from specdecode_ref.sizing import DraftSize, SizeRow


def _choice(name, size, speedup=1.2):
    rows = (SizeRow(max(size, 1), 1.5, 0.01, 150.0 * speedup / 1.2),)
    return DraftSize(name, size, rows[0].tokens_per_s if size else 125.0, 125.0, rows, 0.008, "test machine")


@pytest.fixture
def chosen(monkeypatch):
    """load_proposer's sizing replaced by a fixed choice (no timing): {name: size}."""
    sizes = {}

    def fake(name, model, table=None, refresh=False, batch_size=1):
        return _choice(name, sizes[name])

    monkeypatch.setattr(sizing, "machine_draft_size", fake)
    monkeypatch.delenv("SPECDECODE_DRAFT_SIZES", raising=False)
    return sizes


def check_load_proposer(load, model, chosen):
    chosen.update({"eagle": 5, "eagle-tree": 3, "ngram": 0})
    p = load("eagle", model)
    assert p.k == 5 and p.sizing.size == 5, "without k the machine's choice is drafted"
    assert "chosen for this machine" in repr(p)
    assert load("eagle", model, k=2).k == 2, "an explicit k wins over the machine's choice"
    assert not hasattr(load("eagle", model, k=2), "sizing")
    assert load("eagle-tree", model).k == 3
    aside = load("ngram", model)
    assert isinstance(aside, StandAside) and "drafts nothing" in repr(aside)
    assert load("ngram", model, k=4).k == 4, "an explicit k drafts even where plain is predicted faster"
    assert load("ngram", model, k_per_matched_token=None).k == default_k("ngram"), \
        "keyword arguments that change the drafter: the table does not describe it, the fixed k is used"
    assert load("ngram").k == default_k("ngram"), "no target to time: the fixed k"


def test_load_proposer_sizes_for_the_machine(embedded, chosen):
    check_load_proposer(load_proposer, embedded[0], chosen)


def test_load_proposer_that_ignores_an_explicit_k_is_caught(embedded, chosen):
    def sizes_always(name, target=None, k=None, **kwargs):  # planted twin: the choice beats k
        return load_proposer(name, target, **kwargs)

    with pytest.raises(AssertionError):
        check_load_proposer(sizes_always, embedded[0], chosen)


def test_load_proposer_that_never_stands_aside_is_caught(embedded, chosen):
    def never_aside(name, target=None, k=None, **kwargs):  # planted twin: drafts the fixed k instead
        p = load_proposer(name, target, k=k, **kwargs)
        return p.drafter if isinstance(p, StandAside) else p

    with pytest.raises(AssertionError):
        check_load_proposer(never_aside, embedded[0], chosen)


def test_fixed_sizes_switch(embedded, chosen, monkeypatch):
    chosen["eagle"] = 5
    monkeypatch.setenv("SPECDECODE_DRAFT_SIZES", "fixed")
    assert load_proposer("eagle", embedded[0]).k == default_k("eagle")


def test_choice_is_logged_once(embedded, chosen, caplog, monkeypatch):
    import specdecode_ref.proposers as proposers

    monkeypatch.setattr(proposers, "_SAID", set())  # a fresh process's memory of what it has said
    chosen["early-exit"] = 3
    with caplog.at_level(logging.INFO, logger="specdecode_ref.proposers"):
        load_proposer("early-exit", embedded[0])
        load_proposer("early-exit", embedded[0])
    lines = [r.getMessage() for r in caplog.records if "early-exit" in r.getMessage()]
    assert len(lines) == 1, f"the choice is logged once per process, got {lines}"
    assert "k = 3 chosen for this machine" in lines[0]


def test_stand_aside_decodes_plainly(embedded, chosen):
    model, tok = embedded
    chosen["draft"] = 0
    aside = load_proposer("draft", model)
    ids = chat_ids(tok, load_workloads(per_category=1)["code"][0]["messages"])
    out = generate(model, ids, proposer=aside, max_new_tokens=12, stop_on_eos=False)
    plain = autoregressive_generate(model, ids, max_new_tokens=12, stop_on_eos=False)
    assert torch.equal(out.tokens, plain.tokens) and out.stats.drafted == 0


def test_real_choice_on_this_machine(embedded, monkeypatch):
    """Without stubs: the cached curve of this machine and the stored table give a size the
    table measured (or 0), and the repr says which."""
    monkeypatch.delenv("SPECDECODE_DRAFT_SIZES", raising=False)
    p = load_proposer("eagle-tree", embedded[0])
    table = sizing.stored_draft_sizes()["drafters"]["eagle-tree"]["sizes"]
    assert p.sizing.size == 0 or str(p.sizing.size) in table
    assert isinstance(p, StandAside) or p.k == p.sizing.size
    assert "plain decoding" in repr(p)


@pytest.mark.parametrize("name", ["medusa", "hydra", "eagle-tree", "pard-tree"])
def test_every_tree_size_the_table_can_choose_is_exact(embedded, name):
    """Greedy output equals plain decoding at every node budget the table can choose."""
    model, tok = embedded
    ids = chat_ids(tok, load_workloads(per_category=1)["summarization"][0]["messages"])
    plain = autoregressive_generate(model, ids, max_new_tokens=20, stop_on_eos=False).tokens.tolist()
    for size in sorted(int(s) for s in sizing.stored_draft_sizes()["drafters"][name]["sizes"]):
        out = generate(model, ids, proposer=load_proposer(name, model, k=size), max_new_tokens=20, stop_on_eos=False)
        assert out.tokens.tolist() == plain, f"{name} at {size} nodes"
    assert torch.is_tensor(ids)


def test_a_wrapper_around_a_drafter_standing_aside_stands_aside(embedded, chosen):
    from specdecode_ref.proposers.adaptive import HeuristicK

    chosen["eagle"] = 0
    wrapped = HeuristicK(load_proposer("eagle", embedded[0]))
    assert wrapped.drafts_nothing, "a wrapper must forward drafts_nothing, or it drafts empty steps the long way"
