"""Block verification (verify.block_verify) at the level of one verification call.

Three properties, each checked on small vocabularies where the exact answer is known:
the emitted tokens, continued by the target, follow the target's law (chi-square over every
sequence, with planted twins that break the prefix weights or the stopping rule at the same
size); at temperature 0 with one-hot drafts it keeps exactly the token rule's prefix; and in
expectation it keeps at least as many drafted tokens as token-by-token rejection sampling.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import specdecode_ref.verify as verify
from specdecode_ref.verify import PLACEHOLDER_TOKEN_ID, block_verify, greedy_verify, rejection_sample

from support import BLOCK_TWINS, assert_law, chi2_pvalue


def _case(seed: int, v: int = 3, k: int = 3, sharp: float = 1.5):
    """Target distributions p [k+1, V] and draft distributions q [k, V], the same after any prefix."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, v, generator=g) * sharp, -1)
    q = torch.softmax(torch.randn(k, v, generator=g) * sharp, -1)
    return p, q


def _draws(verifier, p, q, n: int, seed: int):
    """n verification calls on drafts X_i ~ q_i; returns (the full sequences [n, k+1]: the emitted
    tokens, then the target's own draws for the positions the call did not reach, accepted [n])."""
    k1, v = p.shape
    k = k1 - 1
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], 1)
    out, acc = verifier(p.expand(n, k1, v), drafts, q.expand(n, k, v), g)
    fill = torch.stack([torch.multinomial(p[j], n, replacement=True, generator=g) for j in range(k1)], 1)
    seq = torch.where(torch.arange(k1)[None] <= acc[:, None], out, fill)
    return seq, acc


def _pvalue(verifier, p, q, n=20000, seed=0) -> float:
    k1, v = p.shape
    seq, _ = _draws(verifier, p, q, n, seed)
    counts = np.bincount(np.ravel_multi_index(tuple(seq.T.numpy()), (v,) * k1), minlength=v ** k1)
    exact = p[0].double()
    for j in range(1, k1):
        exact = torch.outer(exact, p[j].double()).reshape(-1)
    return chi2_pvalue(counts, exact.numpy())


TWINS = BLOCK_TWINS  # (where in verify.py, planted function) per twin


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bug", [None, *TWINS])
def test_block_verification_follows_the_target(seed, bug, monkeypatch):
    if bug is not None:
        where, fn = TWINS[bug]
        monkeypatch.setattr(verify, where, fn)
    p, q = _case(seed)
    assert_law(_pvalue(block_verify, p, q), bug)


def test_padded_rows_follow_the_target():
    """Rows padded with PLACEHOLDER_TOKEN_ID after 1 of 3 drafts: the bonus comes from p_1."""
    p, q = _case(4)
    k1, v = p.shape
    n = 20000

    def padded(pp, drafts, qq, g):
        drafts = drafts.clone()
        drafts[:, 1:] = PLACEHOLDER_TOKEN_ID
        out, acc = block_verify(pp, drafts, qq, g)
        assert int(acc.max()) <= 1
        return out, acc

    assert_law(_pvalue(padded, p, q, n=n), None)


def test_temperature_zero_keeps_the_token_rules_prefix():
    """One-hot target rows and one-hot drafts: block verification keeps the longest prefix of
    drafts equal to the target's argmax and adds the argmax after it, like greedy_verify."""
    g = torch.Generator().manual_seed(0)
    b, k, v = 400, 5, 4
    logits = torch.randn(b, k + 1, v, generator=g)
    target = logits.argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.7, target[:, :k], torch.randint(0, v, (b, k), generator=g))
    one_hot = torch.nn.functional.one_hot(target, v).float()
    out, acc = block_verify(one_hot, drafts, None, g)
    ref_out, ref_acc = greedy_verify(logits, drafts)
    assert torch.equal(acc, ref_acc) and torch.equal(out, ref_out)
    assert set(acc.tolist()) >= {0, k}  # both ends occur


@pytest.mark.parametrize("seed", range(4))
def test_never_fewer_accepted_tokens_in_expectation(seed):
    """Mean accepted drafts, block against token rule on the same cases: never lower beyond noise."""
    p, q = _case(seed, v=4, k=4, sharp=1.0)
    _, a_block = _draws(block_verify, p, q, 40000, seed)
    _, a_token = _draws(rejection_sample, p, q, 40000, seed + 100)
    mb, mt = a_block.float().mean(), a_token.float().mean()
    se = float(np.sqrt(a_block.float().var() / 40000 + a_token.float().var() / 40000))
    print(f"seed {seed}: accepted per call, block {mb:.3f}, token {mt:.3f} (se {se:.3f})")
    assert mb >= mt - 3 * se


# --- the engine: generate(..., verification="block") and generate_batch ---------------------------

@pytest.fixture(scope="module")
def small_vocab():
    from support import make_tiny_llama

    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2, layers=2)


def _block_joint_pvalue(model, factory, sampling, n=2000, steps=3) -> float:
    """n requests drawn as one generate_batch with block verification (row i equals generate with
    seed i, checked on two rows), their first ``steps`` tokens against the exact joint law. Each
    request decodes three tokens more than it counts, so that its first verification step drafts
    a whole block (a draft of one token would be judged by the token rule's own test)."""
    from support import exact_joint

    from specdecode_ref import generate, generate_batch

    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    new = steps + 3
    rows = [r.tokens.tolist() for r in generate_batch(model, [prompt] * n, proposer=factory(), max_new_tokens=new,
                                                      sampling=sampling, seed=0, stop_on_eos=False,
                                                      verification="block")]
    for seed in (0, n - 1):
        alone = generate(model, prompt, proposer=factory(), max_new_tokens=new, sampling=sampling, seed=seed,
                         stop_on_eos=False, verification="block")
        assert alone.tokens.tolist() == rows[seed]
    v = model.config.vocab_size
    counts = np.zeros(v ** steps)
    for toks in rows:
        counts[np.ravel_multi_index(toks[:steps], (v,) * steps)] += 1
    return chi2_pvalue(counts, exact_joint(model, prompt, steps, sampling))


@pytest.mark.parametrize("bug", [None, "stop_at_weight"])
@pytest.mark.parametrize("temperature,top_k,seed", [(1.0, 0, 0), (0.7, 0, 1)])
def test_generate_with_block_verification_follows_the_target(small_vocab, temperature, top_k, seed, bug, monkeypatch):
    """A drafter whose q is far from the target's (support.RandomDraftProposer, k = 3) on a
    6-token model: three tokens' joint law, block verification judging three-token blocks."""
    from support import RandomDraftProposer

    from specdecode_ref.sampling import SamplingParams

    if bug is not None:
        monkeypatch.setattr(verify, *TWINS[bug])
    sampling = SamplingParams(temperature=temperature, top_k=top_k)
    assert_law(_block_joint_pvalue(small_vocab, lambda: RandomDraftProposer(3, 6, seed=seed), sampling), bug)


def test_block_verification_refuses_trees_and_greedy_is_unchanged(small_vocab):
    from support import RandomTreeProposer

    from specdecode_ref import autoregressive_generate, generate, generate_batch
    from specdecode_ref.proposers import NgramProposer
    from specdecode_ref.sampling import SamplingParams

    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    s = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match="verifies chain drafts"):
        generate(small_vocab, prompt, RandomTreeProposer(6), max_new_tokens=4, sampling=s, verification="block")
    with pytest.raises(ValueError, match="verifies chain drafts"):
        generate_batch(small_vocab, [prompt], RandomTreeProposer(6), max_new_tokens=4, sampling=s, verification="block")
    with pytest.raises(ValueError, match="verification must be one of"):
        generate(small_vocab, prompt, NgramProposer(k=2), verification="blocks")
    plain = autoregressive_generate(small_vocab, prompt, max_new_tokens=12).tokens
    assert torch.equal(generate(small_vocab, prompt, NgramProposer(k=3, min_n=1), max_new_tokens=12,
                                verification="block").tokens, plain)


def test_the_papers_two_token_example():
    """Sun et al.'s motivating example: context-free target (1/3, 2/3) and draft (2/3, 1/3), two
    drafted tokens. Token by token keeps 10/9 drafts per call in expectation, block verification
    11/9 (both derived in notebook 11); the first emitted token follows the target."""
    p = torch.tensor([[1 / 3, 2 / 3]]).expand(3, 2)
    q = torch.tensor([[2 / 3, 1 / 3]]).expand(2, 2)
    n = 60000
    seq_b, a_block = _draws(block_verify, p, q, n, 0)
    _, a_token = _draws(rejection_sample, p, q, n, 1)
    sd = float(a_block.float().std()) / np.sqrt(n)
    assert abs(float(a_block.float().mean()) - 11 / 9) < 4 * sd
    assert abs(float(a_token.float().mean()) - 10 / 9) < 4 * sd
    first = float((seq_b[:, 0] == 1).float().mean())
    assert abs(first - 2 / 3) < 4 * np.sqrt(2 / 9 / n)


@pytest.mark.parametrize("seed", range(2))
def test_one_hot_drafts_keep_what_the_token_rule_keeps(seed):
    """A deterministic drafter (q one-hot, n-gram's case): the prefix weight can only fall, never
    recover, so block verification keeps as many tokens as the token rule, in expectation."""
    p, _ = _case(seed, v=4, k=4, sharp=1.0)
    k1, v = p.shape
    n = 40000
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(p[i], n, replacement=True, generator=g) for i in range(k1 - 1)], 1)
    _, a_block = block_verify(p.expand(n, k1, v), drafts, None, g)
    _, a_token = rejection_sample(p.expand(n, k1, v), drafts, None, g)
    se = float(np.sqrt(a_block.float().var() / n + a_token.float().var() / n))
    assert abs(float(a_block.float().mean() - a_token.float().mean())) < 4 * se
