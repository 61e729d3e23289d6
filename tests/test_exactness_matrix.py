"""Every registered proposer on every decoding path, on the real model in fp32.

Greedy speculative output must equal plain greedy decoding token for token, whatever the drafter
and whatever the path: ``generate`` with one draft token (k = 1) and with a deep draft (rejection at
the first position, partial and longer accepted runs all occur and are rolled back; the histogram
of acceptance lengths is printed: the shipped drafters, trained on chat answers, rarely have four
drafts in a row accepted on these prompts, so full-length acceptance at k = 4 is exercised by the
tiny-model tests in tests/proposers/test_drafters.py, and here by the three-head chains), ``generate_batch``
(each row against that prompt decoded alone; tree drafts of both rows verified in one forward), the
serving scheduler (with a KV pool too small for both requests at full length, so requests are
preempted and resumed), and an EOS token that arrives *inside* an accepted draft (generation must
stop right there, with finish reason "eos", on every path). The one combination a batch cannot
drive, a wrapper around early exit (its batched drafter is early exit's own), is refused with a
message that says why; that refusal is tested too.

The table this file fills (exact = tested equal to plain):

    proposer          generate k=1   generate deep k   generate_batch  scheduler  EOS inside a draft
    ngram             exact          exact (k=5)       exact           exact      exact (all paths)
    draft             exact          exact (k=4)       exact           exact      exact (all paths)
    draft-fullvocab   exact          exact (k=4)       exact           exact      exact (all paths)
    early-exit        exact          exact (k=4)       exact           exact      exact (all paths)
    medusa-chain      exact          exact (k=3)*      exact           exact      exact (all paths)
    hydra-chain       exact          exact (k=3)*      exact           exact      exact (all paths)
    eagle             exact          exact (k=4)       exact           exact      exact (all paths)
    medusa (tree)     exact (1 node) exact (8 nodes)   exact           exact      exact (all paths)
    hydra (tree)      exact (1 node) exact (8 nodes)   exact           exact      exact (all paths)
    eagle-tree        exact (1 node) exact (16 nodes)  exact           exact      exact (all paths)
    eagle3            exact          exact (k=4)***    exact           exact      exact (all paths)
    suffix            exact          exact (k=24)**    exact           exact      exact (all paths)
    pard              exact          exact (k=4)       exact           exact      exact (all paths)
    pard-tree         exact (1 node) exact (8 nodes)   exact           exact      exact (all paths)

    * three heads: a chain of Medusa or Hydra heads drafts at most 3 tokens.
    ** after one earlier request, whose output suffix decoding then drafts from (long accepted runs).
    *** the EAGLE-3 head trained here on the CPU: rejections and one-token runs on these cases.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from specdecode_ref import autoregressive_generate, chat_ids, generate, generate_batch
from specdecode_ref.engine import ACCEPTED
from specdecode_ref.measure.harness.workloads import load_workloads
from specdecode_ref.proposers import load_proposer
from specdecode_ref.serving.scheduler import serve

NEW = 24
# Deep draft per chain drafter; trees: a wide tree (8 or 16 nodes) against a single node (k=1). Every
# size load_proposer can choose for a tree is checked in tests/proposers/test_sized_defaults.py.
DEEP = {"ngram": 5, "draft": 4, "draft-fullvocab": 4, "early-exit": 4, "medusa-chain": 3, "hydra-chain": 3,
        "eagle": 4, "eagle3": 4, "medusa": 8, "hydra": 8, "eagle-tree": 16, "suffix": 24,
        "pard": 4, "pard-tree": 8}
TREES = {"medusa", "hydra", "eagle-tree", "pard-tree"}
LEARNS_FROM_EARLIER_REQUESTS = {"suffix"}  # its global tree holds earlier requests' outputs
# The EAGLE-3 head trained on the CPU keeps a second drafted token in a row rarely (2 % of steps at
# draft position 3 on the benchmark): on these cases its runs stop at one accepted token. Its
# rollback after every acceptance length is checked with test heads in proposers/test_eagle3.py.
SHORT_RUNS = {"eagle3"}
NAMES = sorted(DEEP)


@pytest.fixture(scope="module")
def cases(embedded):
    """Two chat prompts and their plain greedy outputs, EOS ignored: one whose answer is easy to
    predict (every drafter has whole drafts accepted there) and a benchmark question (where most
    drafts fail early), so that every acceptance length occurs."""
    model, tok = embedded
    question = load_workloads(["qa"], per_category=1)["qa"][0]["messages"]
    ids = [chat_ids(tok, "Count from 1 to 30, separated by commas."), chat_ids(tok, question)]
    return [(i, autoregressive_generate(model, i, max_new_tokens=NEW, stop_on_eos=False).tokens) for i in ids]


def _proposer(model, name, k):
    return load_proposer(name, model) if k is None else load_proposer(name, model, k=k)


@pytest.fixture(scope="module")
def deep_runs(embedded, cases):
    """name -> (proposer at its deep k, its greedy runs on the cases): computed once, used twice."""
    model, _ = embedded
    done = {}

    def runs(name):
        if name not in done:
            proposer = _proposer(model, name, DEEP[name])
            if name in LEARNS_FROM_EARLIER_REQUESTS:  # one earlier request gives it long drafts to verify
                generate(model, cases[0][0], proposer=proposer, max_new_tokens=NEW, stop_on_eos=False)
            done[name] = proposer, [generate(model, ids, proposer=proposer, max_new_tokens=NEW, stop_on_eos=False)
                                    for ids, _ in cases]
        return done[name]

    return runs


@pytest.mark.parametrize("name", NAMES)
def test_generate_one_draft_token_is_exact(embedded, cases, name):
    model, _ = embedded
    proposer = load_proposer(name, model, k=1)
    for ids, plain in cases:
        out = generate(model, ids, proposer=proposer, max_new_tokens=NEW, stop_on_eos=False)
        assert torch.equal(out.tokens, plain), f"{name} at k=1 changed the greedy output"
        assert max(out.stats.accepted_lengths) <= 1


@pytest.mark.parametrize("name", NAMES)
def test_generate_deep_draft_is_exact_at_every_acceptance_length(cases, deep_runs, name):
    proposer, runs = deep_runs(name)
    lengths = Counter()
    for (ids, plain), out in zip(cases, runs):
        assert torch.equal(out.tokens, plain), f"{name} ({proposer!r}) changed the greedy output"
        lengths.update(out.stats.accepted_lengths)
    print(f"{proposer!r}: accepted length -> steps {dict(sorted(lengths.items()))}")
    # Rejection at the first draft, and partial and longer accepted runs, each rolled back: at least
    # three different acceptance lengths, none and two or more among them.
    if name in SHORT_RUNS:
        assert 0 in lengths and 1 in lengths, dict(lengths)
        return
    assert 0 in lengths and max(lengths) >= 2 and len(lengths) >= 3, dict(lengths)


def _serve(model, prompts, proposer, budgets, **kw):
    # Blocks of 8 slots, enough for the longest request alone but not for both at full length.
    need = [-(-(p.numel() + m + proposer.k) // 8) for p, m in zip(prompts, budgets)]
    return serve(model, prompts, proposer, max_new_tokens=budgets, num_blocks=max(need) + 2, block_size=8,
                 max_num_batched_tokens=1024, max_num_seqs=2, check_every_step=True, **kw)


def _batch_outputs(model, prompts, proposer):
    results = generate_batch(model, prompts, proposer=proposer, max_new_tokens=NEW, stop_on_eos=False)
    return [r.tokens.tolist() for r in results], sum(r.stats.accepted for r in results)


def _served_outputs(model, prompts, proposer):
    result = _serve(model, prompts, proposer, [NEW] * len(prompts), stop_on_eos=False)
    print(f"{proposer!r}: {result.num_preemptions} preemptions")
    return [r.output for r in result.requests], result.metrics()["spec_decode_num_accepted_tokens"]


MANY_REQUEST_PATHS = {"generate_batch": _batch_outputs, "scheduler": _served_outputs}


@pytest.mark.parametrize("path", sorted(MANY_REQUEST_PATHS))
@pytest.mark.parametrize("name", NAMES)
def test_many_request_paths_are_exact_per_request(embedded, cases, name, path):
    """Each row of a batch, and each request the scheduler serves (with preemption), equals that
    prompt decoded alone, for every registered proposer, chains and trees."""
    model, _ = embedded
    prompts = [ids for ids, _ in cases]
    proposer = _proposer(model, name, DEEP[name])
    outputs, accepted = MANY_REQUEST_PATHS[path](model, prompts, proposer)
    assert outputs == [plain.tolist() for _, plain in cases], f"{name}: a request differs from its prompt alone"
    assert accepted > 0


@pytest.mark.parametrize("path", sorted(MANY_REQUEST_PATHS))
def test_a_wrapped_early_exit_is_refused_in_a_batch(embedded, cases, path):
    """Early exit verifies in one request's own cache; in a batch it drafts through its own batched
    form, which a wrapper (here adaptive K) hides: refused, with the reason and the way out."""
    from specdecode_ref.proposers.adaptive import AdaptiveK

    model, _ = embedded
    wrapped = AdaptiveK(load_proposer("early-exit", model, k=4))
    with pytest.raises(NotImplementedError, match="runs the verification forward itself"):
        MANY_REQUEST_PATHS[path](model, [ids for ids, _ in cases], wrapped)


def _eos_inside_a_draft(run, plain):
    """The first position j >= 4 holding an accepted draft token whose id does not occur earlier in
    the output: as EOS, it must end generation at j, inside the step that accepted it."""
    tokens = plain.tolist()
    for j, kind in enumerate(run.token_kinds):
        if j >= 4 and kind == ACCEPTED and tokens[j] not in tokens[:j] and j + 1 < len(tokens):
            return j, tokens[j]
    return None


@pytest.mark.parametrize("name", NAMES)
def test_eos_inside_an_accepted_draft_stops_there(embedded, cases, deep_runs, name):
    model, _ = embedded
    proposer, runs = deep_runs(name)
    found = [(ids, plain, _eos_inside_a_draft(run, plain)) for (ids, plain), run in zip(cases, runs)]
    found = [(ids, plain, hit) for ids, plain, hit in found if hit is not None]
    assert found, f"{name}: no accepted draft token to turn into EOS"
    for ids, plain, (j, eos) in found:
        out = generate(model, ids, proposer=proposer, max_new_tokens=NEW, eos_token_id=eos)
        assert out.tokens.tolist() == plain[: j + 1].tolist() and out.finish_reason == "eos", name
        assert out.token_kinds[-1] == ACCEPTED  # it ended inside the draft, not on a bonus token
    # Every proposer decodes in a batch and in the scheduler: the same stop on both paths.
    ids, plain, (j, eos) = found[0]
    prompts = [ids, cases[0][0] if ids is not cases[0][0] else cases[1][0]]
    rows = generate_batch(model, prompts, proposer=proposer, max_new_tokens=NEW, eos_token_id=eos)
    assert rows[0].tokens.tolist() == plain[: j + 1].tolist() and rows[0].finish_reason == "eos"
    served = _serve(model, prompts, proposer, [NEW, NEW], eos_token_id=eos)
    first = served.requests[0]
    assert first.output == plain[: j + 1].tolist() and first.row.finish == "eos"
