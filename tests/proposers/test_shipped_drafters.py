"""The shipped, trained drafters on the real embedded model (fp32): they load, they draft (some
drafts are accepted), and greedy output equals plain decoding token for token."""
import pytest
import torch

from specdecode_ref import SamplingParams, autoregressive_generate, chat_ids, generate
from specdecode_ref.proposers import load_proposer
from specdecode_ref.measure.workloads import load_workloads

NAMES = ["draft", "draft-fullvocab", "early-exit", "medusa", "medusa-chain", "hydra", "hydra-chain", "eagle",
         "eagle-tree"]


@pytest.fixture(scope="module")
def cases(embedded):
    model, tok = embedded
    wl = load_workloads(["summarization", "qa"], per_category=1)
    ids = [chat_ids(tok, p["messages"]) for c in wl for p in wl[c]]
    return [(i, autoregressive_generate(model, i, max_new_tokens=40, stop_on_eos=False).tokens) for i in ids]


@pytest.mark.parametrize("name", NAMES)
def test_shipped_drafter_greedy_equals_plain(embedded, cases, name):
    model, _ = embedded
    proposer = load_proposer(name, model)
    accepted = 0
    for ids, plain in cases:
        out = generate(model, ids, proposer=proposer, max_new_tokens=40, stop_on_eos=False)
        assert torch.equal(out.tokens, plain), f"{name} changed the greedy output"
        accepted += out.stats.accepted
    assert accepted > 0, f"{name} never had a draft accepted: are the shipped weights loaded?"


def test_shipped_draft_samples(embedded, cases):
    """A sampled run works end to end (the distribution itself is tested on tiny models)."""
    model, _ = embedded
    ids, _ = cases[0]
    out = generate(model, ids, proposer=load_proposer("draft", model), max_new_tokens=24,
                   sampling=SamplingParams(temperature=0.7, top_p=0.9), seed=1)
    assert len(out.tokens) > 0 and out.stats.steps > 0


def test_shipped_loaders_need_the_embedded_target():
    from support import make_tiny_llama

    with pytest.raises(ValueError, match="SmolLM2"):
        load_proposer("draft", make_tiny_llama())
