"""Helpers shared by the tests: a tiny random Llama and a pooled chi-square test.

(Kept out of conftest.py: labs/ has a conftest.py too, and two modules named ``conftest`` on
sys.path shadow each other, so ``from conftest import ...`` would be ambiguous.)
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from specdecode_ref.engine import generate
from specdecode_ref.proposers import Draft, Proposer
from specdecode_ref.sampling import logits_to_probs
from specdecode_ref.measure.stats import chi_square_test


def make_tiny_llama(vocab_size: int = 64, seed: int = 0, sharpness: float = 1.0, layers: int = 2,
                    init_range: float = 0.02):
    """A randomly initialised Llama small enough for thousands of forwards in a test.

    sharpness scales the output head so next-token distributions are peaked rather than uniform;
    a larger init_range (e.g. 0.3) keeps greedy decoding out of short cycles.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      initializer_range=init_range)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.generation_config.eos_token_id = None
    model.requires_grad_(False)
    return model


def chi2_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """p-value of the package's pooled chi-square goodness-of-fit test (0 if a p = 0 token was drawn)."""
    return chi_square_test(counts, probs, min_expected).pvalue


def exact_joint(model, prompt, steps, sampling):
    """P(t1..t_steps | prompt) for every sequence, by enumeration."""
    v = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=steps)))
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, len(prompt) - 1: -1]
    probs = logits_to_probs(logits, sampling)
    return probs.gather(2, seqs[..., None]).squeeze(-1).prod(1).numpy()


def sampled_joint_pvalue(model, prompt, proposer_factory, sampling, n=2000, steps=3, generate_fn=generate):
    v = model.config.vocab_size
    counts = np.zeros(v ** steps)
    for seed in range(n):
        toks = generate_fn(model, prompt, proposer=proposer_factory(), max_new_tokens=steps,
                           sampling=sampling, seed=seed).tokens.tolist()
        counts[np.ravel_multi_index(toks, (v,) * steps)] += 1
    return chi2_pvalue(counts, exact_joint(model, prompt, steps, sampling))


class RecordsAccepted:
    """Mixin for proposers under test: ``accepted`` lists every step's accepted drafts, and
    ``check(state, outcome)`` runs after each step's own ``on_verified`` (override it to assert
    the proposer's state)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.accepted = []

    def on_verified(self, state, outcome):
        super().on_verified(state, outcome)
        self.accepted.append(outcome.num_accepted)
        self.check(state, outcome)

    def check(self, state, outcome):
        pass


def noisy(module, scale, seed):
    """A copy of ``module`` with Gaussian noise on its weights: a drafter that is right only sometimes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp_min(1e-3))
    return module


class RandomDraftProposer(Proposer):
    """A probabilistic drafter with its own (wrong) distribution q, drawn with the request's
    generator: it exercises draft_probs, the part of rejection sampling a one-hot q never reaches."""

    def __init__(self, k, vocab, seed=0):
        super().__init__(k)
        g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(torch.randn(vocab, generator=g) * 2, -1)

    def propose(self, state):
        q = logits_to_probs(self.q.log()[None].expand(self.k, -1), state.sampling)
        toks = torch.multinomial(q, 1, generator=state.generator).squeeze(1)
        return Draft(toks, probs=q)


def check_unrolled_matches_sequential(head, target, features, tokens, steps: int) -> None:
    """Training-time test shows the head what drafting shows it: step 1 reads the real features,
    step s its own outputs of step s - 1. Each row of the batched unrolled forward (one call per
    step, ``masks.unrolled_mask``) must equal drafting from that row's prefix with a fresh cache,
    one token at a time. features: [1, q, F]; tokens: [1, q]."""
    from transformers import DynamicCache

    from specdecode_ref import masks
    from specdecode_ref.masks import causal_mask

    q = tokens.shape[1]
    pos = torch.arange(q)[None]
    with torch.no_grad():
        cache = DynamicCache()
        outs = [head(features, tokens, pos, causal_mask(q, 0), target, cache)]
        for s in range(2, steps + 1):
            outs.append(head(outs[-1][:, :-1], tokens[:, s - 1:], pos[:, s - 1:], masks.unrolled_mask(q, s), target,
                             cache))
        for j in range(q - steps + 1):
            c = DynamicCache()
            out = head(features[:, : j + 1], tokens[:, : j + 1], pos[:, : j + 1], causal_mask(j + 1, 0), target,
                       c)[:, -1:]
            for s in range(2, steps + 1):  # drafted token s: own previous output, next real token
                out = head(out, tokens[:, j + s - 1: j + s], pos[:, j + s - 1: j + s], None, target, c)
                torch.testing.assert_close(outs[s - 1][:, j], out[:, 0], atol=1e-5, rtol=1e-4)


def need_vllm() -> str:
    """vLLM's version, or skip the test with the reason; under SPECDECODE_REQUIRE_VLLM=1 (CI) a
    missing or broken vLLM environment fails the test instead."""
    from specdecode_ref.serving import vllm_runner

    ok, why = vllm_runner.vllm_available()
    if not ok:
        if vllm_runner.vllm_required():
            pytest.fail(f"{vllm_runner.REQUIRE_ENV}=1 but vLLM is not available: {why}")
        pytest.skip(f"vLLM is not available: {why}")
    return why
