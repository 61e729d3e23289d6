"""The measurement tools of block verification and suffix decoding (notebook 11): the exact
per-draft keep probabilities against sampling, the recorder of verification calls, the Markov
joint-law check (with a verifier that must fail it), and the stream benchmark on the tiny model."""
from __future__ import annotations

import pytest
import torch

from specdecode_ref import generate
from specdecode_ref.measure.suffix_bench import run_stream, summarize_stream
from specdecode_ref.measure.verification_bench import (VerifierCalls, compare_means, expected_accepted, expected_kept,
                                                       first_position_tries, keep_probabilities, markov_joint_check)
from specdecode_ref.measure.harness.workloads import load_repeating
from specdecode_ref.sampling import SamplingParams
from specdecode_ref.pitfalls import resample_from_target
from specdecode_ref.trees import ROOT
from specdecode_ref.verify import block_verify, rejection_sample, tree_rejection_sample


def test_the_papers_example_exactly():
    p, q = torch.tensor([[1 / 3, 2 / 3]] * 3), torch.tensor([[2 / 3, 1 / 3]] * 2)
    assert expected_accepted(p, q, "token") == pytest.approx(10 / 9, abs=1e-6)
    assert expected_accepted(p, q, "block") == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("rule, verifier", [("token", rejection_sample), ("block", block_verify)])
def test_keep_probabilities_match_the_verifiers(rule, verifier):
    """For one fixed draft, the exact law of the number kept against 40,000 verifications."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 5, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(3, 5, generator=g) * 1.5, -1)
    draft = torch.tensor([1, 3, 0])
    exact = keep_probabilities(p, q, draft, rule)
    assert float(exact.sum()) == pytest.approx(1.0, abs=1e-9)
    n = 40000
    _, kept = verifier(p.expand(n, 4, 5), draft.expand(n, 3), q.expand(n, 3, 5), g)
    seen = torch.bincount(kept, minlength=4).double() / n
    assert torch.allclose(seen, exact, atol=4 * (0.25 / n) ** 0.5 + 1e-3), (seen, exact)
    if rule == "block":  # a one-hot q: the block rule's law is the token rule's
        assert torch.allclose(keep_probabilities(p, None, draft, "block"), keep_probabilities(p, None, draft, "token"))


def test_compare_means_is_the_ratio_of_means_with_an_interval():
    a, b = [0.0, 2.0, 3.0, 5.0, 1.0, 4.0], [1.0, 1.0, 2.0, 4.0, 1.0, 3.0]
    c = compare_means(a, b, unit="run")
    assert c.ratio == pytest.approx(15 / 12) and c.lo <= c.ratio <= c.hi and c.n == 6 and c.unit == "run"
    assert compare_means([2.0, 2.1, 2.2, 2.0], [1.0, 1.0, 1.1, 1.0]).verdict == "better"
    assert compare_means([1.0, 2.0], [2.0, 1.0]).verdict == "level"  # too few pairs for an interval
    with pytest.raises(ValueError, match="B's mean is 0"):
        compare_means([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])


def test_first_position_tries_match_sampled_sibling_drafts():
    """m one-token drafts drawn from q under the root, verified by tree_rejection_sample: the
    share of steps that keep a drafted token against the exact probability, for m = 1..3."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, 5, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(1, 5, generator=g) * 1.5, -1)
    draft = torch.multinomial(q[0], 1, generator=g)
    exact = first_position_tries([(p[None], draft[None], q[None])], tries=3).iloc[0]
    assert exact.keep_1 == pytest.approx(float(torch.minimum(p[0], q[0]).sum()))
    assert exact.keep_1 <= exact.keep_2 <= exact.keep_3 <= 1
    n = 6000
    for m in (1, 2, 3):
        kept = 0
        for _ in range(n):
            tokens = torch.multinomial(q[0], m, replacement=True, generator=g)
            path, _ = tree_rejection_sample(p[0].expand(m + 1, 5), [ROOT] * m, tokens, g, q[0].expand(m, 5))
            kept += int(path.numel() > 0)
        assert kept / n == pytest.approx(exact[f"keep_{m}"], abs=4 * (0.25 / n) ** 0.5), m


@pytest.mark.parametrize("verifier, ok", [(block_verify, True), (rejection_sample, True),
                                           (resample_from_target, False)])
def test_markov_joint_check_passes_exact_rules_and_fails_a_wrong_one(verifier, ok):
    result = markov_joint_check(verifier, n=8000, seed=2)
    assert (result.pvalue > 1e-3) == ok, result


def test_recorded_calls_are_the_engines(tiny_model):
    from support import RandomDraftProposer

    drafter = RandomDraftProposer(3, tiny_model.config.vocab_size, seed=0)
    with VerifierCalls() as rec:
        out = generate(tiny_model, torch.tensor([1, 2, 3, 4]), drafter, max_new_tokens=12,
                       sampling=SamplingParams(temperature=1.0), seed=0)
    assert 0 < len(rec.calls) <= out.stats.steps  # one call per step that drafted (the last may not)
    assert sum(int((d >= 0).sum()) for _, d, _ in rec.calls) == out.stats.drafted
    kept = expected_kept(rec.calls)
    assert len(kept) == len(rec.calls) and (kept.token >= 0).all() and (kept.block <= kept.draft_len).all()
    import specdecode_ref.engine as engine

    assert engine.rejection_sample is rejection_sample  # the recorder put the verifier back


def test_the_stream_benchmark_checks_outputs_and_pairs_requests(tiny_model):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 60, (10,), generator=g) for _ in range(4)]
    prompts += prompts[:2]  # repeats: suffix decoding drafts the earlier outputs
    df = run_stream(tiny_model, prompts, ["a", "b", "a", "b", "a", "b"], max_new_tokens=16, progress=False)
    assert set(df.method) == {"plain", "ngram", "suffix"} and len(df) == 18
    suffix = df[df.method == "suffix"].set_index("request")
    assert suffix.tau[4] > 2 and suffix.tau[5] > 2  # the repeats draft their first answers
    table = summarize_stream(df).set_index("method")
    assert table.tau_vs_ngram["suffix"].n == 6 and table.tau_vs_ngram["suffix"].unit == "request"


def test_the_repeating_stream_is_interleaved_by_family():
    stream = load_repeating(per_family=2)
    families = [r["family"] for r in stream]
    assert len(stream) == 8 and families[:4] == families[4:] and len(set(families)) == 4
    with pytest.raises(ValueError, match="unknown families"):
        load_repeating(families=["poetry"])
