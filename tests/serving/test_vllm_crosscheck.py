"""vLLM beside the course's engine: the same drafter gives the same counters.

Both engines decode the same two chat prompts greedily in fp32 with prompt lookup (k = 5,
n-grams of 1..4, earliest occurrence of the longest match, no periodic extension: vLLM's rule in
``vllm/v1/spec_decode/ngram_proposer.py``). Drafts are a function of the context alone, so while
the two outputs agree token for token the counters must agree exactly, position by position;
after a divergence (two attention implementations can break a near-tie differently) the contexts
differ. The test therefore checks the outputs first and compares the counters over the prompts
whose outputs are identical. Measured here: both prompts identical, and drafting steps 19,
drafted 93, accepted 18, accepted per position [8, 5, 2, 2, 1] in both engines.

The same holds for our distilled 4-layer draft model, exported as a standalone Hugging Face
directory (``serving/export.py``) and run as vLLM's "draft_model" method: its greedy drafts are a
function of the context alone too. Measured here (k = 3): both outputs equal plain greedy, and
drafting steps 35, drafted 105, accepted 18, accepted per position [9, 5, 4] in both engines.

vLLM lives in its own environment (``make vllm-env``); without it this test is skipped and says how
to build it (under SPECDECODE_REQUIRE_VLLM=1, as in CI, it fails instead).
"""
import pytest

from support import need_vllm

from specdecode_ref import generate
from specdecode_ref.models import EMBEDDED, cache_dir, chat_ids
from specdecode_ref.proposers import NgramProposer
from specdecode_ref.proposers.draft_model import DraftModelProposer, load_draft_model
from specdecode_ref.serving import vllm_runner as V
from specdecode_ref.serving.export import export_draft_model

pytestmark = pytest.mark.vllm

MAX_TOKENS = 48
PROMPTS = [
    "Summarize in one sentence: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, "
    "named after the engineer Gustave Eiffel, whose company designed and built it from 1887 to 1889.",
    "Rewrite this Python function with a docstring and type hints, keeping its body:\n"
    "def area(w, h):\n    result = w * h\n    return result",
]


@pytest.fixture(scope="module")
def vllm_ok():
    return need_vllm()


def test_ngram_counters_match_vllm(embedded, vllm_ok):
    model, tok = embedded
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    k = 5
    vllm = V.run_vllm(cache_dir() / EMBEDDED, prompts, max_tokens=MAX_TOKENS, dtype="float32",
                      speculative_config=V.ngram_config(k=k, min_n=1, max_n=4), one_at_a_time=True)
    ours = [generate(model, p, proposer=NgramProposer(k=k, min_n=1, max_n=4, occurrence="first",
                                                      extend_periodically=False),
                     max_new_tokens=MAX_TOKENS, seed=0) for p in prompts]
    same = _identical(ours, vllm)
    if len(same) < len(prompts):  # counters are only comparable on identical outputs: run those alone
        vllm = V.run_vllm(cache_dir() / EMBEDDED, [prompts[i] for i in same], max_tokens=MAX_TOKENS,
                          dtype="float32", speculative_config=V.ngram_config(k=k), one_at_a_time=True)
    _assert_same_counters(V.acceptance_summary(vllm["metrics"]), [ours[i] for i in same], k)


@pytest.mark.vllm_extra
def test_draft_model_counters_match_vllm(embedded, vllm_ok, tmp_path):
    model, tok = embedded
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    k = 3
    config = V.draft_model_config(export_draft_model(tmp_path / "draft", model), k=k)
    vllm = V.run_vllm(cache_dir() / EMBEDDED, prompts, max_tokens=MAX_TOKENS, dtype="float32",
                      speculative_config=config, one_at_a_time=True)
    draft = load_draft_model(model)
    ours = [generate(model, p, proposer=DraftModelProposer(draft, k=k), max_new_tokens=MAX_TOKENS, seed=0)
            for p in prompts]
    same = _identical(ours, vllm)
    if len(same) < len(prompts):
        vllm = V.run_vllm(cache_dir() / EMBEDDED, [prompts[i] for i in same], max_tokens=MAX_TOKENS,
                          dtype="float32", speculative_config=config, one_at_a_time=True)
    _assert_same_counters(V.acceptance_summary(vllm["metrics"]), [ours[i] for i in same], k)


def _identical(ours, vllm) -> list:
    """Indices of the prompts whose two greedy outputs agree token for token (at least one)."""
    same = [i for i, r in enumerate(ours) if r.tokens.tolist() == vllm["tokens"][i]]
    assert same, ("vLLM's greedy fp32 output differs from ours on every prompt: "
                  f"ours {[r.tokens.tolist()[:12] for r in ours]}, vLLM {[t[:12] for t in vllm['tokens']]}")
    return same


def _assert_same_counters(theirs: dict, results, k: int) -> None:
    stats = results[0].stats
    for r in results[1:]:
        stats = stats.merge(r.stats)
    assert theirs["accepted"] > 0, "the drafter accepted nothing: the prompts do not exercise it"
    assert (theirs["draft_steps"], theirs["drafted"], theirs["accepted"]) == \
        (stats.drafting_steps, stats.drafted, stats.accepted)
    # vLLM's per-position counter is a survival count: accepted at i over all drafts.
    per_pos = stats.accepted_per_position + [0] * (k - len(stats.accepted_per_position))
    assert theirs["accepted_per_pos"] == per_pos[:k]
    assert theirs["mean_accepted_length"] == pytest.approx(stats.vllm_mean_acceptance_length)
