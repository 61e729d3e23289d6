"""Proposer wrappers nested in each other and run for a batch: adaptive K and the acceptance probe,
in either order, adapt the draft length and record acceptance without changing the output; the rows
of a batch keep their own wrapper state and share the draft model's weights."""
import ast
import inspect

import pytest
import torch

from specdecode_ref import autoregressive_generate, generate, generate_batch
from specdecode_ref.measure.sampling_regime import AcceptanceProbe
from specdecode_ref.proposers import DraftModelProposer, NgramProposer, base, batch
from specdecode_ref.proposers.adaptive import GoodputK, HeuristicK
from specdecode_ref.proposers.base import ProposerWrapper, fork
from specdecode_ref.proposers.draft_model import build_draft_model

K0 = 2  # the draft model's own k: a wrapper that did not pass k down would draft exactly this

NESTINGS = {
    "probe(heuristic)": lambda p: AcceptanceProbe(HeuristicK(p)),
    "heuristic(probe)": lambda p: HeuristicK(AcceptanceProbe(p)),
    "goodput(probe)": lambda p: GoodputK(AcceptanceProbe(p), verify_cost=1.0, k_init=K0, k_max=8),  # flat cost: k grows
}


def prompts(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (6 + i,), generator=g) for i in range(n)]


def layer(wrapper, cls):
    """The first proposer of type ``cls`` in a chain of wrappers."""
    p = wrapper
    while not isinstance(p, cls):
        p = p.proposer
    return p


@pytest.fixture(scope="module")
def draft(target4):
    return build_draft_model(target4, (0, 1))


@pytest.mark.parametrize("nesting", NESTINGS)
def test_nested_wrappers_adapt_k_and_record_acceptance(target4, draft, nesting):
    inner = DraftModelProposer(draft, k=K0)
    wrapper = NESTINGS[nesting](inner)
    controller, probe = layer(wrapper, HeuristicK if "heuristic" in nesting else GoodputK), layer(wrapper,
                                                                                                   AcceptanceProbe)
    for prompt in prompts():
        plain = autoregressive_generate(target4, prompt, max_new_tokens=40).tokens
        out = generate(target4, prompt, proposer=wrapper, max_new_tokens=40)
        assert torch.equal(out.tokens, plain)  # greedy, fp32: token for token
        steps = controller.history
        # k moved during the request, and the draft model drafted the k the controller chose,
        # as far as the token budget allowed (one token of each step is the target's).
        assert len({r.k for r in steps}) > 1 and max(r.drafted for r in steps) > K0
        generated = 1  # the prefill's token
        for r in steps:
            assert r.drafted == min(r.k, 40 - generated - 1)
            generated += r.accepted + 1
        assert [r.drafted for r in steps] == out.stats.draft_lengths
        record = probe.records[-1]
        assert record.accepted == out.stats.accepted > 0
        assert record.tried == sum(min(r.accepted + 1, r.drafted) for r in steps)
        # Greedy: the target's p is one-hot, so the predicted acceptance is the observed one.
        assert record.predicted == pytest.approx(record.accepted)
    assert len(probe.records) == len(prompts())


def test_fork_shares_weights_through_wrappers(draft):
    wrapper = HeuristicK(AcceptanceProbe(DraftModelProposer(draft, k=K0, draft_vocab=torch.arange(40))))
    wrapper.observe(2, 2)
    copy = fork(wrapper)
    inner, copied = layer(wrapper, DraftModelProposer), layer(copy, DraftModelProposer)
    assert copied is not inner and copy.proposer is not wrapper.proposer
    assert copied.model is draft and copied.head is inner.head  # Modules: the same objects
    assert [p.data_ptr() for p in copied.model.parameters()] == [p.data_ptr() for p in draft.parameters()]
    # Wrapper state is the copy's own.
    assert copy.history == wrapper.history and copy.history is not wrapper.history
    assert copy.proposer.records is not wrapper.proposer.records
    copy.k = 7
    assert copied.k == 7 and inner.k == wrapper.k == 4


def test_fork_copies_plain_tensors():
    """Tensors outside Modules are per-request state a proposer may write in place (here a
    controller's counts): each fork gets its own."""

    class CountingK(HeuristicK):
        def __init__(self, proposer):
            super().__init__(proposer)
            self.counts = torch.zeros(2)

        def update(self, drafted, accepted):
            self.counts += torch.tensor([drafted, accepted], dtype=torch.float)
            return super().update(drafted, accepted)

    original = CountingK(NgramProposer(k=2))
    copy = fork(original)
    copy.observe(2, 1)
    assert copy.counts.tolist() == [2.0, 1.0] and original.counts.tolist() == [0.0, 0.0]


def test_adaptive_draft_model_in_a_batch_shares_its_weights(target4, draft):
    """generate_batch drives one fork of the wrapper per row: every row adapts its own k, and all
    rows draft with the one draft model (no copy of its weights per row)."""
    # k_max = the starting k: generate_batch holds every row's draft to the k of the proposer it
    # was given, so the rows move their k below it.
    wrapper = HeuristicK(DraftModelProposer(draft, k=4), k_max=4)
    rows = []
    make = wrapper.batch_proposer

    def keep_rows():
        per_row = make()
        begin = per_row.begin

        def begin_and_keep(states):
            begin(states)
            rows.extend(per_row.rows)

        per_row.begin = begin_and_keep
        return per_row

    wrapper.batch_proposer = keep_rows
    ps = prompts(4, seed=1)
    outs = generate_batch(target4, ps, proposer=wrapper, max_new_tokens=40)
    for prompt, out in zip(ps, outs):
        assert torch.equal(out.tokens, autoregressive_generate(target4, prompt, max_new_tokens=40).tokens)
    assert len(rows) == len(ps) and len({id(r) for r in rows}) == len(ps)
    params = [p.data_ptr() for p in draft.parameters()]
    for row in rows:
        assert row.proposer is not wrapper.proposer and row.proposer.model is draft
        assert [p.data_ptr() for p in row.proposer.model.parameters()] == params
        assert len({r.k for r in row.history}) > 1  # each row adapted
    assert len({tuple(row.k_trace) for row in rows}) > 1  # from its own outcomes
    assert wrapper.history == []  # the wrapper passed in only served as the template


def test_imports_flow_one_way():
    """base.py imports nothing from batch.py; batch.py re-exports what moved to base.py."""
    tree = ast.parse(inspect.getsource(base))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if "batch" in m]
    assert batch.fork is base.fork and batch.PerRowBatchProposer is base.PerRowBatchProposer
    assert batch.BatchProposer is base.BatchProposer
    assert isinstance(HeuristicK(NgramProposer(k=2)).batch_proposer(), base.PerRowBatchProposer)
    assert issubclass(AcceptanceProbe, ProposerWrapper) and issubclass(HeuristicK, ProposerWrapper)
