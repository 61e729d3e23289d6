"""The shipped, trained drafters on the real embedded model (fp32): a sampled run, and the loaders'
errors. Greedy exactness of every shipped drafter on every decoding path is tests/test_exactness_matrix.py."""
import pytest

from specdecode_ref import SamplingParams, chat_ids, generate
from specdecode_ref.proposers import load_proposer
from specdecode_ref.measure.harness.workloads import load_workloads


@pytest.fixture(scope="module")
def cases(embedded):
    _, tok = embedded
    wl = load_workloads(["summarization"], per_category=1)
    return [(chat_ids(tok, p["messages"]), None) for c in wl for p in wl[c]]


def test_shipped_draft_samples(embedded, cases):
    """A sampled run with the shipped draft model draws exactly what the batch engine draws for the
    same seed, q included (the distribution itself is tested on tiny models), and drafts are kept."""
    from specdecode_ref.batch import generate_batch

    model, _ = embedded
    ids, _ = cases[0]
    s = SamplingParams(temperature=0.7, top_p=0.9)
    out = generate(model, ids, proposer=load_proposer("draft", model), max_new_tokens=24, sampling=s, seed=1)
    [row] = generate_batch(model, [ids], proposer=load_proposer("draft", model), max_new_tokens=24, sampling=s, seed=1)
    assert len(out.tokens) == 24 and out.tokens.tolist() == row.tokens.tolist()
    assert out.stats.accepted > 0


def test_shipped_loaders_need_the_embedded_target():
    from support import make_tiny_llama

    with pytest.raises(ValueError, match="SmolLM2"):
        load_proposer("draft", make_tiny_llama())
