"""Lab 4 grading tests (visible): the checks the notebook walks you through.

Everything runs on tiny random Llamas (vocabulary 64, hidden size 32) in fp32: a target, a
"close" draft (the target's weights plus 5 % noise: acceptance varies from 0 to k), a "stranger"
(an independent model: almost nothing is accepted) and the target itself as its own draft
(everything is accepted). The reference for every output is plain greedy decoding of the target
(``specdecode_ref.autoregressive_generate``).
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch

from specdecode_ref import autoregressive_generate, kv
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)
# Flagged by the grader: a loop that hands the work to the course's engine or its draft proposer.
REFERENCE_PATTERNS = [r"import[^\n]*\b(autoregressive_generate|generate|DraftModelProposer)\b|specdecode_ref\.engine|"
                      r"generate\(|proposers\.draft_model"]

VOCAB = 64


# --- models -------------------------------------------------------------------------------------

def tiny_llama(seed: int, layers: int = 2, vocab: int = VOCAB):
    """A random Llama whose greedy output does not fall into a short cycle (initializer_range=0.3)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.requires_grad_(False)
    return model


def noisy_copy(model, noise: float, seed: int):
    """The same architecture and weights plus Gaussian noise of ``noise`` times each tensor's std."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=gen))
    return out


def first_layers(model, n: int):
    """A draft made of the model's first n decoder layers, its final norm and its head (shared)."""
    from transformers import LlamaForCausalLM

    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = n
    draft = LlamaForCausalLM(cfg).eval()
    draft.model.embed_tokens = model.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(model.model.layers[:n])
    draft.model.norm = model.model.norm
    draft.lm_head = model.lm_head
    draft.generation_config.eos_token_id = None
    draft.requires_grad_(False)
    return draft


@functools.lru_cache(maxsize=None)
def model(name: str):
    if name == "target":
        return tiny_llama(0)
    if name == "close":  # acceptance varies from 0 to k
        return noisy_copy(model("target"), 0.05, seed=1)
    if name == "twin":  # a copy of the target (a separate object, so its forwards are counted apart)
        return copy.deepcopy(model("target"))
    if name == "stranger":  # an unrelated model: almost nothing is accepted
        return tiny_llama(1)
    if name == "shallow":  # 1 layer, sharing the target's first layer, norm and head
        return first_layers(model("target"), 1)
    if name == "deep":  # 3 layers, unrelated
        return tiny_llama(3, layers=3)
    if name == "other_vocab":
        return tiny_llama(4, vocab=VOCAB + 16)
    raise KeyError(name)


def make_prompt(seed: int, length: int = 7) -> list:
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, VOCAB, (length,), generator=gen).tolist()


@functools.lru_cache(maxsize=None)
def _plain(name: str, prompt: tuple, n: int) -> tuple:
    return tuple(autoregressive_generate(model(name), list(prompt), max_new_tokens=n,
                                         stop_on_eos=False).tokens.tolist())


def plain(name: str, prompt, n: int) -> list:
    """Plain greedy decoding of model ``name``: the first n new tokens (computed once, for 64)."""
    return list(_plain(name, tuple(prompt), max(n, 64))[:n])


def as_ids(x) -> list:
    return [int(t) for t in torch.as_tensor(x).reshape(-1).tolist()]


# --- instruments --------------------------------------------------------------------------------

class CountForwards:
    """Counts the forward calls of each model while active, and the positions (input tokens) they
    read: ``with CountForwards(lab, a, b) as c: ... c[a], c.read(a)``. Under the grader your code
    runs in a process of its own, on its own copy of each model: the counts come from there."""

    def __init__(self, lab, *models):
        self.lab, self.models = lab, models
        self.remote = callable(getattr(type(lab), "forward_counts", None))
        self.counts = {}
        self.positions = {}

    def __enter__(self):
        self.handles = []
        for m in self.models:
            self.counts.setdefault(id(m), 0)
            self.positions.setdefault(id(m), 0)
            if not self.remote:
                self.handles.append(m.register_forward_pre_hook(self._hook(id(m)), with_kwargs=True))
        if self.remote:
            self.start = {id(m): self.lab.forward_counts(m) for m in self.models}
        return self

    def _hook(self, key):
        def hook(module, args, kwargs):
            self.counts[key] += 1
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                self.positions[key] += int(torch.as_tensor(ids).shape[-1])
            elif kwargs.get("inputs_embeds") is not None:
                self.positions[key] += int(kwargs["inputs_embeds"].shape[-2])
        return hook

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        if self.remote:
            for m in self.models:
                now, start = self.lab.forward_counts(m), self.start[id(m)]
                self.counts[id(m)] = now["forwards"] - start["forwards"]
                self.positions[id(m)] = now["positions"] - start["positions"]

    def __getitem__(self, m):
        return self.counts[id(m)]

    def read(self, m) -> int:
        """Positions (tokens) model ``m`` read in its forwards."""
        return self.positions[id(m)]


def cache_mismatch(m, cache, tokens: list, length: int):
    """None if ``cache`` holds exactly the keys/values that ``m`` computes for tokens[:length];
    else a description of the difference."""
    have = kv.cache_len(cache)
    if have != length:
        return f"holds {have} positions, expected {length}"
    if length == 0:
        return None
    fresh = kv.new_cache(m)
    with torch.no_grad():  # .forward, not __call__: CountForwards must not count the checker's forwards
        m.forward(input_ids=torch.tensor([tokens[:length]]), past_key_values=fresh, use_cache=True)
    for i, (mine, ref) in enumerate(zip(cache.layers, fresh.layers)):
        for what in ("keys", "values"):
            a, b = getattr(mine, what), getattr(ref, what)
            if a.shape != b.shape or not torch.allclose(a, b, atol=1e-4, rtol=1e-4):
                pos = "?"
                if a.shape == b.shape:
                    bad = ((a - b).abs() > 1e-3).any(dim=-1).any(dim=1)[0].nonzero().flatten().tolist()
                    pos = bad[:5]
                return (f"has {length} positions but layer {i} {what} differ from a fresh cache of the "
                        f"committed tokens at positions {pos}: stale entries of rejected drafts, or a "
                        f"token fed at the wrong position")
    return None


class InvariantChecker:
    """The ``on_step`` callback: after every step, both caches must follow the lab's invariant."""

    def __init__(self, target, draft, prompt, k, max_new_tokens):
        self.target, self.draft, self.k, self.n = target, draft, k, max_new_tokens
        self.prompt = list(prompt)
        self.committed = len(prompt)
        self.steps = 0
        self.problems = []
        self.caches = None  # the cache objects of the first step: every later step must use the same

    def __call__(self, tokens, target_cache, draft_cache):
        tokens = as_ids(tokens)
        before = self.committed
        self.steps += 1
        step = f"step {self.steps} (committed {before} -> {len(tokens)})"
        if tokens[:len(self.prompt)] != self.prompt or len(tokens) <= before:
            self.problems.append(f"{step}: on_step got tokens that do not extend the committed ones")
            self.committed = len(tokens)
            return
        if self.caches is None:
            self.caches = (target_cache, draft_cache)
        elif target_cache is not self.caches[0] or draft_cache is not self.caches[1]:
            which = " and ".join(n for n, a, b in (("target", target_cache, self.caches[0]),
                                                   ("draft", draft_cache, self.caches[1])) if a is not b)
            self.problems.append(f"{step}: a new {which} cache object: create each cache once and roll it "
                                 "back, do not rebuild it")
        k_step = min(self.k, self.n - (before - len(self.prompt)))
        want_target = len(tokens) - 1
        want_draft = min(len(tokens) - 1, before + k_step - 1)  # d_k is never fed to the draft
        bad = cache_mismatch(self.target, target_cache, tokens, want_target)
        if bad:
            self.problems.append(f"{step}: the target cache {bad}")
        bad = cache_mismatch(self.draft, draft_cache, tokens, want_draft)
        if bad:
            self.problems.append(f"{step}: the draft cache {bad}")
        self.committed = len(tokens)


def run(lab, target, draft, prompt, k, max_new_tokens, check=False):
    """Run the student's loop; with check=True also verify the cache invariant after every step."""
    checker = InvariantChecker(target, draft, prompt, k, max_new_tokens) if check else None
    with CountForwards(lab, target, draft) as counts:
        result = lab.speculative_greedy(target, draft, list(prompt), k, max_new_tokens, on_step=checker)
    return result, counts, checker


def expected_schedule(accepted: list, k: int, max_new_tokens: int):
    """(drafted per step, tokens emitted per step) implied by the accepted counts and the budget rule."""
    drafted, emitted, done = [], [], 0
    for a in accepted:
        k_step = min(k, max_new_tokens - done)
        drafted.append(k_step)
        emitted.append(min(a + 1, max_new_tokens - done))
        done += emitted[-1]
    return drafted, emitted, done


# --- the pieces ----------------------------------------------------------------------------------

@points(1)
def test_rollback(lab):
    """rollback crops a cache to its first keep_len positions; decoding then continues correctly."""
    m = model("target")
    tokens = make_prompt(0, 10)
    cache = kv.new_cache(m)
    with torch.no_grad():
        full = m(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True).logits[0]
    lab.rollback(cache, 6)
    assert kv.cache_len(cache) == 6
    with torch.no_grad():
        again = m(input_ids=torch.tensor([tokens[6:]]), past_key_values=cache, use_cache=True).logits[0]
    assert torch.allclose(again, full[6:], atol=1e-4), "after rollback(cache, 6) the cache does not continue at position 6"
    lab.rollback(cache, 10)  # the current length: nothing to do
    assert kv.cache_len(cache) == 10
    for bad in (11, -1):
        with pytest.raises(ValueError):
            lab.rollback(cache, bad)


@points(2)
def test_draft_tokens(lab):
    """draft_tokens: the draft's own greedy continuation, k forwards, the cache grows by pending + k - 1."""
    d = model("close")
    p = make_prompt(1)
    cache = kv.new_cache(d)
    with CountForwards(lab, d) as c:
        got = as_ids(lab.draft_tokens(d, cache, p, 4))
    assert got == plain("close", p, 4), "the drafts are not the draft model's greedy continuation"
    assert c[d] == 4, f"drafting 4 tokens took {c[d]} draft forwards, expected 4 (pending tokens in one forward)"
    assert kv.cache_len(cache) == len(p) + 3, "after drafting k tokens the cache holds the pending tokens + k - 1"
    # Suppose all four were accepted and a bonus token x followed: d_4 and x are pending now.
    x = 5
    got2 = as_ids(lab.draft_tokens(d, cache, [got[3], x], 3))
    assert got2 == plain("close", p + got + [x], 3), "drafting after two pending tokens went wrong"
    assert kv.cache_len(cache) == len(p) + 4 + 1 + 2
    with pytest.raises(ValueError):
        lab.draft_tokens(d, kv.new_cache(d), p, 0)


@points(2)
def test_verify_greedy(lab):
    """verify_greedy: one target forward; the accepted prefix, then the correction or the bonus."""
    t = model("target")
    p = make_prompt(2)
    g = plain("target", p, 6)
    k = 5
    for j in range(k + 1):  # the first wrong draft at position j (j = k: all correct)
        drafted = list(g[:k])
        if j < k:
            drafted[j] = (drafted[j] + 1) % VOCAB
        cache = kv.new_cache(t)
        with torch.no_grad():
            t(input_ids=torch.tensor([p[:-1]]), past_key_values=cache, use_cache=True)
        with CountForwards(lab, t) as c:
            a, emitted = lab.verify_greedy(t, cache, [p[-1]], drafted)
        assert c[t] == 1, f"verify_greedy ran the target {c[t]} times, expected once"
        assert int(a) == j, f"first wrong draft at position {j}: got num_accepted={a}"
        assert as_ids(emitted) == g[:j + 1], f"first wrong draft at position {j}: emitted {as_ids(emitted)}, want {g[:j + 1]}"
        assert kv.cache_len(cache) == len(p) + k, "verify_greedy must not roll the cache back (the loop does)"
    # The first step: empty cache, the whole prompt pending.
    a, emitted = lab.verify_greedy(t, kv.new_cache(t), p, g[:3])
    assert (int(a), as_ids(emitted)) == (3, g[:4])


# --- the loop --------------------------------------------------------------------------------------

@points(1)
@pytest.mark.parametrize("draft", ["close", "stranger"])
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_matches_plain_greedy(lab, k, draft):
    """speculative_greedy equals plain greedy decoding token for token (budgets 5, 16, 29)."""
    t, d = model("target"), model(draft)
    for i, n in enumerate((5, 16, 29)):
        p = make_prompt(10 * k + i)
        result, _, _ = run(lab, t, d, p, k, n)
        got = as_ids(result["tokens"])
        want = plain("target", p, n)
        assert len(got) == n, f"k={k}, max_new_tokens={n}: got {len(got)} tokens"
        assert got == want, f"k={k}, max_new_tokens={n}: output differs from plain greedy decoding at " \
                            f"token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"


@points(2)
@pytest.mark.parametrize("k", [2, 4])
def test_draft_equal_to_target_accepts_everything(lab, k):
    """With the target as its own draft every draft is accepted: k + 1 tokens per step."""
    t = model("target")
    n = 23
    p = make_prompt(3)
    result, _, _ = run(lab, t, t, p, k, n)
    assert as_ids(result["tokens"]) == plain("target", p, n)
    drafted, _, _ = expected_schedule(result["accepted"], k, n)
    assert list(result["accepted"]) == drafted, (
        f"accepted per step {list(result['accepted'])}, expected every draft accepted {drafted}: a draft "
        "identical to the target only disagrees with it when its cache is wrong")
    assert len(result["accepted"]) == -(-n // (k + 1))


@points(3)
@pytest.mark.parametrize("draft", ["close", "target", "stranger"])
def test_cache_invariant_after_every_step(lab, draft):
    """After every step: target cache = committed tokens but the last; draft cache = the same, or one
    shorter after a step that accepted everything; the keys/values equal a fresh cache's."""
    t, d = model("target"), model(draft)
    for k, n in ((3, 17), (4, 26)):
        p = make_prompt(20 + k)
        result, _, checker = run(lab, t, d, p, k, n, check=True)
        assert checker.steps == len(result["accepted"]) > 0, "call on_step once per step"
        assert not checker.problems, f"k={k}: " + "; ".join(checker.problems[:3])
        assert as_ids(result["tokens"]) == plain("target", p, n)


@points(2)
def test_one_target_forward_per_step(lab):
    """One target forward per step, k_step draft forwards per step, and counters that say so."""
    t, d = model("target"), model("close")
    k, n = 4, 30
    p = make_prompt(4)
    result, counts, _ = run(lab, t, d, p, k, n)
    steps = len(result["accepted"])
    assert counts[t] == steps == result["target_forwards"], (
        f"{counts[t]} target forwards ran, the result reports {result['target_forwards']}, for {steps} steps")
    drafted, emitted, done = expected_schedule(result["accepted"], k, n)
    assert list(result["drafted"]) == drafted, f"drafted per step {result['drafted']}, expected min(k, remaining) = {drafted}"
    assert done == n, f"the accepted counts {result['accepted']} do not add up to {n} tokens"
    assert counts[d] == sum(drafted) == result["draft_forwards"], (
        f"{counts[d]} draft forwards ran, the result reports {result['draft_forwards']}, expected {sum(drafted)}")


def expected_reads(prompt_len: int, accepted: list, drafted: list) -> tuple:
    """Positions the target and the draft read over a whole generation when both caches are kept
    and rolled back: the prompt once, then per step only the pending tokens and the drafts."""
    target = prompt_len + sum(drafted) + len(drafted) - 1  # later steps: the last token + the drafts
    draft = prompt_len + sum(k - 1 for k in drafted)  # pending + k - 1 per step
    for a, k in zip(accepted[:-1], drafted[:-1]):
        draft += 2 if a == k else 1  # pending at the next step: d_k and the bonus, or the last token
    return target, draft


@points(3)
@pytest.mark.parametrize("draft", ["close", "twin"])
def test_caches_reused_not_rebuilt(lab, draft):
    """Each cache is created once and rolled back: the same cache objects at every step, and each
    forward reads only the tokens its cache has not seen (the prompt once, then a few per step)."""
    t, d = model("target"), model(draft)
    k, n = 3, 30
    p = make_prompt(8, length=20)
    result, counts, checker = run(lab, t, d, p, k, n, check=True)
    assert as_ids(result["tokens"]) == plain("target", p, n)
    new_objects = [x for x in checker.problems if "cache object" in x]
    assert not new_objects, new_objects[0]
    want_t, want_d = expected_reads(len(p), list(result["accepted"]), list(result["drafted"]))
    assert counts.read(t) == want_t, (
        f"the target read {counts.read(t)} positions in {counts[t]} forwards, expected {want_t}: the prompt once, "
        "then the last committed token and the drafts per step; re-reading the context means its cache was rebuilt")
    assert counts.read(d) == want_d, (
        f"the draft read {counts.read(d)} positions in {counts[d]} forwards, expected {want_d}: the prompt once, "
        "then only its pending tokens and its own drafts; re-reading the context means its cache was rebuilt")


def scripted_draft(seed: int, full: list, wrong: set):
    """A tiny Llama turned into a draft that proposes plain greedy's token at every position except
    the positions in ``wrong``: the acceptance length of every step is then known in advance
    (see specdecode_ref.grading.instruments.script_draft)."""
    from specdecode_ref.grading.instruments import script_draft

    m = tiny_llama(seed)
    script_draft(m, full, wrong)
    return m


def scripted_run(lab, script: list, k: int, prompt_seed: int):
    """A draft that gets exactly script[i] drafts accepted at step i; returns (result, want, checker)."""
    p = make_prompt(prompt_seed)
    n = sum(a + 1 for a in script)
    g = plain("target", p, n)
    full = p + g + [0] * (k + 2)
    wrong, pos, done = set(), len(p), 0
    for a in script:
        k_step = min(k, n - done)
        assert a <= k_step
        if a < k_step:
            wrong.add(pos + a)
        pos += a + 1
        done += a + 1
    d = scripted_draft(9, full, wrong)
    result, _, checker = run(lab, model("target"), d, p, k, n, check=True)
    return result, g, checker


@points(3)
def test_every_acceptance_length(lab):
    """A scripted draft makes steps accept 0, 1, ..., k drafts: the loop rolls back right at each."""
    k = 4
    script = [0, 1, 2, 3, 4, 4, 2, 0, 3, 1]
    result, want, checker = scripted_run(lab, script, k, prompt_seed=5)
    assert as_ids(result["tokens"]) == want, "output differs from plain greedy decoding"
    assert list(result["accepted"]) == script, (
        f"accepted per step {list(result['accepted'])}, the draft was scripted to get {script} accepted")
    assert not checker.problems, "; ".join(checker.problems[:3])


@points(1)
def test_bad_input(lab):
    """k < 1 and a draft with another vocabulary size are refused with ValueError."""
    t, p = model("target"), make_prompt(6)
    for k in (0, -2):
        with pytest.raises(ValueError):
            lab.speculative_greedy(t, model("close"), p, k, 5)
    with pytest.raises(ValueError):
        lab.speculative_greedy(t, model("other_vocab"), p, 3, 5)
