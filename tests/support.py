"""Helpers shared by the tests: a tiny random Llama, a pooled chi-square test, a CPU-starved child process.

(Kept out of conftest.py: labs/ has a conftest.py too, and two modules named ``conftest`` on
sys.path shadow each other, so ``from conftest import ...`` would be ambiguous.)
"""
from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from specdecode_ref.engine import generate
from specdecode_ref.pitfalls import resample_from_target
from specdecode_ref.proposers import Draft, Proposer
from specdecode_ref.verify import rejection_sample
from specdecode_ref.sampling import logits_to_probs
from specdecode_ref.measure.harness.stats import chi_square_test


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
    """p-value of the package's pooled chi-square goodness-of-fit test (0 if a p = 0 token was drawn).
    Prints the sample size and p-value, which ``pytest -rP`` shows for every passing test."""
    pvalue = chi_square_test(counts, probs, min_expected).pvalue
    print(f"chi-square: n={int(np.sum(counts))} p={pvalue:.3g}")
    return pvalue


def reference_probs(logits, sampling):
    """The oracle's own temperature -> top-k -> top-p (float64), written apart from
    specdecode_ref.sampling so the expected law does not share the code under test."""
    z = logits.double()
    if sampling.temperature == 0:
        return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).double()
    z = z / sampling.temperature
    if 0 < sampling.top_k < z.shape[-1]:
        kth = z.sort(-1, descending=True).values[..., sampling.top_k - 1: sampling.top_k]
        z = torch.where(z >= kth, z, -torch.inf)  # ties with the k-th are kept
    if sampling.top_p < 1:
        probs, order = z.softmax(-1).sort(-1, descending=True)
        keep = (probs.cumsum(-1) - probs) < sampling.top_p  # mass of strictly better tokens
        z = torch.where(torch.zeros_like(keep).scatter(-1, order, keep), z, -torch.inf)
    return z.softmax(-1)


def exact_joint(model, prompt, steps, sampling):
    """P(t1..t_steps | prompt) for every sequence, by enumeration (oracle: reference_probs)."""
    v = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=steps)))
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, len(prompt) - 1: -1]
    probs = reference_probs(logits, sampling)
    return probs.gather(2, seqs[..., None]).squeeze(-1).prod(1).numpy()


def sampled_joint_pvalue(model, prompt, proposer_factory, sampling, n=2000, steps=3, generate_fn=generate,
                         batched=False):
    """Chi-square p-value of n draws of the first ``steps`` tokens (seeds 0..n-1) against exact_joint.
    batched=True draws them as one generate_batch (row i seeded i draws what generate(seed=i) draws;
    checked here on the first and last rows)."""
    from specdecode_ref.batch import generate_batch

    v = model.config.vocab_size
    if batched:
        rows = [r.tokens.tolist() for r in generate_batch(model, [prompt] * n, proposer=proposer_factory(),
                                                          max_new_tokens=steps, sampling=sampling, seed=0)]
        for seed in (0, n - 1):
            alone = generate_fn(model, prompt, proposer=proposer_factory(), max_new_tokens=steps,
                                sampling=sampling, seed=seed)
            assert alone.tokens.tolist() == rows[seed], f"batch row {seed} != generate(seed={seed})"
    else:
        rows = [generate_fn(model, prompt, proposer=proposer_factory(), max_new_tokens=steps, sampling=sampling,
                            seed=seed).tokens.tolist() for seed in range(n)]
    counts = np.zeros(v ** steps)
    for toks in rows:
        counts[np.ravel_multi_index(toks, (v,) * steps)] += 1
    return chi2_pvalue(counts, exact_joint(model, prompt, steps, sampling))


# --- planted bugs: every distribution test has a twin, at its own size, that must fail ----------

def always_accept(target_probs, draft_tokens, draft_probs=None, generator=None):
    """Planted bug: accept every draft (what a wrong acceptance test amounts to), bonus from p_K."""
    bonus = torch.multinomial(target_probs[:, -1].float(), 1, generator=generator)
    return torch.cat([draft_tokens, bonus], 1), torch.full((len(draft_tokens),), draft_tokens.shape[1])


def q_of_first_position(target_probs, draft_tokens, draft_probs=None, generator=None):
    """Planted bug: every position is checked against the q of draft position 0."""
    q = None if draft_probs is None else draft_probs[:, :1].expand_as(draft_probs)
    return rejection_sample(target_probs, draft_tokens, q, generator)


def bonus_off_by_one(target_probs, draft_tokens, draft_probs=None, generator=None):
    """Planted bug: the bonus token is drawn from p at the last draft's position, not after it."""
    p = target_probs.clone()
    p[:, -1] = p[:, -2]
    return rejection_sample(p, draft_tokens, draft_probs, generator)


def padding_in_residual(target_probs, draft_tokens, draft_probs=None, generator=None):
    """Planted bug: a padded slot is never accepted but still verified as a one-hot draft of token
    0 (the clamp without the valid mask), so token 0 is removed from the residual there."""
    pad = torch.cat([draft_tokens < 0, torch.zeros_like(draft_tokens[:, :1], dtype=torch.bool)], 1)
    p = target_probs.clone()
    p[..., 0] = p[..., 0].masked_fill(pad, 0.0)
    return rejection_sample(p, draft_tokens.clamp(min=0), draft_probs, generator)


def tree_resample_from_p(target_probs, parents, draft_tokens, generator, draft_probs=None):
    """Planted bug (tree): after a rejected child, the next one is tested against p itself, one-hot
    rule, and the step's last token is drawn from p, never from the residual."""
    from specdecode_ref import trees

    kids = trees.children_by_slot(parents)
    toks, path, slot = draft_tokens.tolist(), [], 0
    while True:
        p = target_probs[slot]
        nxt = next((i for i in kids[slot] if float(torch.rand((), generator=generator)) < float(p[toks[i]])), None)
        if nxt is None:
            last = int(torch.multinomial(p, 1, generator=generator))
            return torch.tensor(path, dtype=torch.long), torch.tensor([toks[i] for i in path] + [last])
        path.append(nxt)
        slot = nxt + 1


def tree_bonus_off_by_one(target_probs, parents, draft_tokens, generator, draft_probs=None):
    """Planted bug (tree): after an accepted leaf, the bonus is drawn from p at the leaf's parent."""
    from specdecode_ref.verify import tree_rejection_sample

    par = torch.as_tensor(parents).tolist()
    leaves = torch.tensor([i for i in range(len(par)) if i not in par], dtype=torch.long)
    p = target_probs.clone()
    p[leaves + 1] = target_probs[torch.tensor(par, dtype=torch.long)[leaves] + 1]
    return tree_rejection_sample(p, parents, draft_tokens, generator, draft_probs)


CHAIN_BUGS = {"resample_from_p": resample_from_target, "always_accept": always_accept,
              "q_of_first_position": q_of_first_position, "bonus_off_by_one": bonus_off_by_one,
              "padding_in_residual": padding_in_residual}
TREE_BUGS = {"resample_from_p": tree_resample_from_p, "bonus_off_by_one": tree_bonus_off_by_one}


def plant(monkeypatch, bug):
    """Plant ``bug`` (None: nothing) in the verifiers that generate and generate_batch call: a
    CHAIN_BUGS sampler for chains and, where there is one, its TREE_BUGS twin for trees, or
    "leaked_top_k": the target's distributions silently cut to the top V - 1 tokens (a default
    filter leaking in, as transformers' generation_config top_k=50 does)."""
    import specdecode_ref.batch as batch
    import specdecode_ref.engine as engine

    if bug == "leaked_top_k":
        from specdecode_ref import sampling as sp

        cut = lambda s, v: s if s.top_k else replace(s, top_k=v - 1)  # noqa: E731
        for mod in (engine, batch):
            monkeypatch.setattr(mod, "logits_to_probs",
                                lambda logits, s=sp.GREEDY: sp.logits_to_probs(logits, cut(s, logits.shape[-1])))
            monkeypatch.setattr(mod, "next_token",
                                lambda logits, s, g=None: sp.next_token(logits, cut(s, logits.shape[-1]), g))
    elif bug is not None:
        for mod in (engine, batch):
            monkeypatch.setattr(mod, "rejection_sample", CHAIN_BUGS[bug])
        if bug in TREE_BUGS:
            for mod in (engine, batch):
                monkeypatch.setattr(mod, "tree_rejection_sample", TREE_BUGS[bug])


def twins(*bugs):
    """Parametrize a distribution test over the correct code (id "correct") and each planted bug."""
    return pytest.mark.parametrize("bug", [pytest.param(None, id="correct")]
                                   + [pytest.param(b, id=f"planted-{b}") for b in bugs])


def assert_law(pvalue, bug):
    """The correct code passes (p > 1e-3); a planted bug fails at the same size (p < 1e-3)."""
    print(f"bug={bug} p={pvalue:.3g}")
    if bug is None:
        assert pvalue > 1e-3, pvalue
    else:
        assert pvalue < 1e-3, f"planted bug {bug!r} not caught: p = {pvalue}"


def check_joint_law(monkeypatch, bug, model, prompt, factory, sampling, n=2000, steps=3, generate_fn=generate,
                    batch_twin=False):
    """sampled_joint_pvalue with ``bug`` planted, then assert_law. batch_twin: draw a planted twin
    as one generate_batch (row i equals generate(seed=i), bug included: both engines call the same
    planted verifier once per row), which is several times cheaper than n generate calls."""
    plant(monkeypatch, bug)
    pv = sampled_joint_pvalue(model, prompt, factory, sampling, n=n, steps=steps, generate_fn=generate_fn,
                              batched=batch_twin and bug is not None)
    assert_law(pv, bug)


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


def assert_cache_is_fresh_prefill(model, cache, tokens) -> None:
    """A drafter's KV cache (``tokens``: the committed tokens it should hold) equals the cache a
    fresh prefill of those tokens builds: a rollback that left a stale or masked entry fails."""
    from specdecode_ref import kv

    fresh = kv.new_cache(model)
    model(input_ids=torch.tensor([list(tokens)]), past_key_values=fresh, use_cache=True)
    for mine, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine.values, ref.values, atol=1e-4, rtol=1e-4)


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


class RandomTreeProposer(RandomDraftProposer):
    """RandomDraftProposer's q drawn into a fixed tree, siblings independently (a sampled tree, as
    SpecInfer drafts): it exercises tree_rejection_sample with draft_probs."""

    PARENTS = (-1, -1, 0, 0, 1)

    def __init__(self, vocab, seed=0):
        super().__init__(len(self.PARENTS), vocab, seed)

    def propose(self, state):
        n = len(self.PARENTS)
        q = logits_to_probs(self.q.log()[None].expand(n, -1), state.sampling)
        toks = torch.multinomial(q, 1, generator=state.generator).squeeze(1)
        return Draft(toks, probs=q, parents=torch.tensor(self.PARENTS))


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


# --- block verification (verify.block_verify): twins that break one of its two rules ----------

def weights_not_carried(ratio, valid):
    """Planted: each prefix weighed by its last token's ratio alone (the token rule's view)."""
    ones = torch.ones(ratio.shape[0], 1)
    return torch.cat([ones, torch.clamp(ratio, max=1.0) * valid], dim=1)


def stop_at_weight(residual_mass, w):
    """Planted: prefix i kept with probability w_i, without the residual's share."""
    return w


BLOCK_TWINS = {"weights_not_carried": ("prefix_weights", weights_not_carried),
               "stop_at_weight": ("stop_probabilities", stop_at_weight)}


@contextlib.contextmanager
def starved_children(command_contains: str, run_s: float = 0.1, stop_s: float = 0.2):
    """Let this process's descendants whose command line contains ``command_contains`` run only
    ``run_s`` of every ``run_s + stop_s`` seconds (SIGSTOP, then SIGCONT): what a saturated CPU
    does to them on the wall clock, without loading the CPU (Linux only)."""
    me = os.getpid()
    done = threading.Event()

    def children():
        parent, wanted = {}, []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                parent[int(d.name)] = int((d / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
                if command_contains.encode() in (d / "cmdline").read_bytes():
                    wanted.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass

        def mine(pid):
            for _ in range(64):
                pid = parent.get(pid, 0)
                if pid == me:
                    return True
                if pid <= 1:
                    return False
            return False

        return [pid for pid in wanted if mine(pid)]

    def signal_all(pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def loop():
        while not done.is_set():
            pids = children()
            signal_all(pids, signal.SIGSTOP)
            done.wait(stop_s)
            signal_all(pids, signal.SIGCONT)
            done.wait(run_s)

    if not Path("/proc/self/stat").exists():
        pytest.skip("needs Linux's /proc to find and pause the grading processes")
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        signal_all(children(), signal.SIGCONT)
