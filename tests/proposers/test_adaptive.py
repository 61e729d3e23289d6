"""Adaptive-K controllers: lossless (only the draft length changes), moving k the right way, and
transparent wrappers (every capability of the wrapped proposer passed on)."""
import inspect

import numpy as np
import pytest
import torch

from specdecode_ref import SamplingParams, autoregressive_generate, chat_ids, generate
from specdecode_ref.measure.replay import draft_match_profile, replay
from specdecode_ref.measure.sampling_regime import AcceptanceProbe
from specdecode_ref.proposers.adaptive import AdaptiveK, FixedK, GoodputK, HeuristicK
from specdecode_ref.proposers import DecodeState, Draft, NgramProposer, Proposer, StepOutcome, load_proposer
from specdecode_ref.proposers.base import ProposerWrapper
from specdecode_ref.proposers.multi_draft import IndependentDrafts

RISING = lambda k: 1.0 + 0.1 * k  # noqa: E731  a verify cost that grows with k, so long drafts must earn their keep


def prompts(n=4, length=6, seed=0):
    """Prompts with repetition so the n-gram proposer finds something to draft."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        base = torch.randint(0, 64, (length,), generator=g)
        out.append(torch.cat([base, base, base[:3]]))
    return out


def controllers():
    return [FixedK(NgramProposer(k=3)),
            HeuristicK(NgramProposer(k=2)),
            HeuristicK(NgramProposer(k=2), k_max=5, carry_over=True),
            GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=8),
            GoodputK(NgramProposer(k=3), verify_cost=1.0, c_step=0.01, k_max=12, halflife=2.0)]


@pytest.mark.parametrize("idx", range(5))
def test_greedy_output_identical_to_plain(tiny_model, idx):
    for prompt in prompts():
        ctrl = controllers()[idx]
        plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=48)
        spec = generate(tiny_model, prompt, proposer=ctrl, max_new_tokens=48)
        assert spec.tokens.tolist() == plain.tokens.tolist()
        assert spec.stats.drafted > 0 and len(ctrl.history) == spec.stats.steps
        assert [r.accepted for r in ctrl.history] == spec.stats.accepted_lengths


def test_wrapper_is_transparent_under_sampling(tiny_model):
    """FixedK only forwards calls: same tokens and counters as the bare proposer, same seed."""
    sp = SamplingParams(temperature=1.0)
    for prompt in prompts(2):
        bare = generate(tiny_model, prompt, proposer=NgramProposer(k=3), max_new_tokens=40, sampling=sp, seed=5)
        wrapped = generate(tiny_model, prompt, proposer=FixedK(NgramProposer(k=3)), max_new_tokens=40,
                           sampling=sp, seed=5)
        assert wrapped.tokens.tolist() == bare.tokens.tolist()
        assert wrapped.stats.accepted_lengths == bare.stats.accepted_lengths


def test_k_actually_changes_and_is_used(tiny_model):
    ctrl = HeuristicK(NgramProposer(k=1))
    prompt = prompts(1)[0]
    generate(tiny_model, prompt, proposer=ctrl, max_new_tokens=60)
    drafted = [r for r in ctrl.history if r.drafted > 0]
    assert len(set(r.k for r in drafted)) > 1  # k moved during the request
    assert all(r.drafted <= r.k for r in ctrl.history)  # and bounded what was drafted


# ---- scripted acceptance: the direction of each controller's response ---------------------

def test_heuristic_rule():
    h = HeuristicK(NgramProposer(k=4))
    h.start_request()
    h.observe(4, 4)
    assert h.k == 6  # all accepted: +2
    h.observe(6, 2)
    assert h.k == 5  # a rejection: -1
    h.observe(0, 0)
    assert h.k == 5  # nothing drafted: no evidence, no change
    h.observe(3, 3)  # a draft cut short (budget) but fully accepted still counts as "all accepted"
    assert h.k == 7
    for _ in range(20):
        h.observe(h.k, 0)
    assert h.k == 1  # floored at 1
    capped = HeuristicK(NgramProposer(k=4), k_max=6)
    capped.start_request()
    for _ in range(5):
        capped.observe(capped.k, capped.k)
    assert capped.k == 6


def test_heuristic_carry_over():
    transient = HeuristicK(NgramProposer(k=3))
    persistent = HeuristicK(NgramProposer(k=3), carry_over=True)
    for h in (transient, persistent):
        h.start_request()
        h.observe(3, 3)
        h.start_request()
    assert transient.k == 3 and persistent.k == 5


def test_goodput_moves_k_with_acceptance():
    g = GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=12, prior_alpha=0.5)
    g.start_request()
    k0 = g.k
    for _ in range(15):
        g.observe(g.k, g.k)  # every draft accepted
    assert g.k > k0 and g.k == 12
    assert g.rates()[0] > 0.9
    ks = []
    for _ in range(40):
        g.observe(g.k, 0)  # every draft rejected at position 1
        ks.append(g.k)
    assert ks[-1] == 1 and all(b <= a for a, b in zip(ks, ks[1:]))  # k only goes down
    assert g.rates()[0] < 0.1
    high = g.expected_goodput()
    assert high.shape == (12,) and np.argmax(high) == 0


def test_goodput_tracks_position_profile():
    """Position 1 always accepted, position 2 never: the best draft is exactly one token."""
    g = GoodputK(NgramProposer(k=4), verify_cost=RISING, k_max=8)
    g.start_request()
    for _ in range(30):
        g.observe(g.k, min(1, g.k))
    assert g.k == 1 and g.rates()[0] > 0.9
    g2 = GoodputK(NgramProposer(k=4), verify_cost=RISING, k_max=8)
    g2.start_request()
    for _ in range(30):
        g2.observe(g2.k, min(3, g2.k))  # three tokens always pass, the fourth never
    assert g2.k == 3


def test_goodput_prefers_short_drafts_when_verification_is_expensive():
    cheap = GoodputK(NgramProposer(k=3), verify_cost=lambda k: 1.0 + 0.01 * k, k_max=16, prior_alpha=0.7)
    dear = GoodputK(NgramProposer(k=3), verify_cost=lambda k: 1.0 + 0.5 * k, k_max=16, prior_alpha=0.7)
    assert cheap.k > dear.k
    curve = {"ns": [1, 2, 3, 4, 5], "times_s": [10.0, 10.2, 9.8, 10.6, 10.8]}
    from_curve = GoodputK(NgramProposer(k=3), verify_cost=curve, k_max=8)
    assert from_curve.verify_cost(0) == pytest.approx(1.0)
    assert from_curve.verify_cost(2) >= from_curve.verify_cost(1)  # the noisy dip at n=3 is smoothed away


def test_goodput_resets_per_request():
    g = GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=10)
    g.start_request()
    k0 = g.k
    for _ in range(10):
        g.observe(g.k, g.k)
    assert g.k != k0
    g.start_request()
    assert g.k == k0 and np.all(g.rates() == pytest.approx(0.5))


class AlwaysRight(Proposer):
    """Drafts the target's own greedy continuation (precomputed), whatever k is."""

    def __init__(self, reference, k=1):
        super().__init__(k)
        self.reference = reference

    def propose(self, state):
        pos = state.num_tokens
        return Draft(torch.tensor(self.reference[pos:pos + self.k], dtype=torch.long))


class AlwaysWrong(AlwaysRight):
    def propose(self, state):
        d = super().propose(state)
        return Draft((d.tokens + 1) % 64)


def test_controllers_in_the_engine(tiny_model):
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    ref = autoregressive_generate(tiny_model, prompt, max_new_tokens=80)
    reference = prompt.tolist() + ref.tokens.tolist() + [0] * 64
    for make in (lambda p: HeuristicK(p, k_init=2, k_max=16),
                 lambda p: GoodputK(p, verify_cost=RISING, k_init=2, k_max=16)):
        up = make(AlwaysRight(reference))
        out = generate(tiny_model, prompt, proposer=up, max_new_tokens=80)
        assert out.tokens.tolist() == ref.tokens.tolist()
        assert max(up.k_trace) > 2 and up.k_trace[-3] > up.k_trace[0]
        down = make(AlwaysWrong(reference))
        out = generate(tiny_model, prompt, proposer=down, max_new_tokens=80)
        assert out.tokens.tolist() == ref.tokens.tolist()
        assert down.k_trace[-1] == 1


def test_replay_matches_engine(tiny_model):
    """Offline replay of a match profile reproduces the engine's steps exactly (greedy, fp32)."""
    for prompt in prompts(3, seed=1):
        plain = autoregressive_generate(tiny_model, prompt, max_new_tokens=50)
        avail, matched = draft_match_profile(NgramProposer(k=2), prompt.tolist(), plain.tokens.tolist(), k_max=16)
        assert len(avail) == 49 and np.all(matched <= avail)
        for make in (lambda: FixedK(NgramProposer(k=3)), lambda: HeuristicK(NgramProposer(k=2)),
                     lambda: GoodputK(NgramProposer(k=3), verify_cost=RISING, k_max=10)):
            live = make()
            res = generate(tiny_model, prompt, proposer=live, max_new_tokens=50)
            rep = replay(make(), avail, matched, verify_cost=RISING)
            assert rep.records == live.history
            assert rep.steps == res.stats.steps and rep.tokens == len(res.tokens)
            assert rep.tau == pytest.approx(res.stats.mean_accepted_length)
            expected_cost = sum(RISING(r.drafted) if r.drafted else 1.0 for r in live.history)
            assert rep.cost == pytest.approx(expected_cost)


def test_bad_arguments():
    with pytest.raises(TypeError):
        HeuristicK("ngram")
    with pytest.raises(ValueError):
        HeuristicK(NgramProposer(k=2), k_min=0)
    with pytest.raises(ValueError):
        HeuristicK(NgramProposer(k=2), k_min=3, k_max=2)
    with pytest.raises(ValueError):
        GoodputK(NgramProposer(k=2), prior_alpha=1.5)
    with pytest.raises(ValueError):
        GoodputK(NgramProposer(k=2), verify_cost=0.0)
    h = HeuristicK(NgramProposer(k=2))
    with pytest.raises(ValueError):
        h.observe(2, 3)
    with pytest.raises(TypeError):
        draft_match_profile(object(), [1, 2], [3, 4])


# ---- wrappers pass on every capability -----------------------------------------------------

# The K controllers, also run around the real model's drafters below.
WRAPPERS = {"fixed": FixedK, "heuristic": HeuristicK,
            "goodput": lambda p: GoodputK(p, verify_cost=RISING, k_max=6)}
# Every wrapper of the package, alone and nested both ways.
ALL_WRAPPERS = {**WRAPPERS,
                "adaptive": AdaptiveK,
                "probe": lambda p: AcceptanceProbe(p, predict=False),
                "probe(heuristic)": lambda p: AcceptanceProbe(HeuristicK(p), predict=False),
                "heuristic(probe)": lambda p: HeuristicK(AcceptanceProbe(p, predict=False)),
                "goodput(fixed(probe))": lambda p: GoodputK(FixedK(AcceptanceProbe(p, predict=False)),
                                                            verify_cost=RISING, k_max=6)}


def _sampling(p):
    p.draft_sampling = "sample"  # IndependentDrafts takes only drafters that sample from q
    return p


# Wrappers that reshape the draft rather than choose its length: several chains become one tree,
# so propose, on_verified and k are theirs by design (test_multi_draft checks what they do with
# them); every other capability they must still pass on.
RESHAPING = {"independent": (lambda p: IndependentDrafts(_sampling(p), 2),
                             {"propose", "on_verified", "k (read)", "k (write)"})}
# Public names on Proposer that a wrapper keeps as its own, and why.
NOT_FORWARDED = {
    "name": "a wrapper names itself after the proposer it wraps, e.g. HeuristicK(ngram)",
    "batch_proposer": "a fork of the whole wrapper per row, so every row keeps its own adaptive K and records",
}
RETURNED = object()


class Spy(Proposer):
    """A proposer whose hooks and flags the test sets one at a time."""

    def propose(self, state):
        raise AssertionError("replaced by the test")


def capabilities() -> list:
    """Every public name declared on Proposer: the hooks and flags the engine may read."""
    return sorted(n for n in vars(Proposer) if not n.startswith("_") and n not in NOT_FORWARDED)


def example_state() -> DecodeState:
    return DecodeState(target=torch.nn.Linear(1, 1), sampling=SamplingParams(), generator=None,
                       prompt_len=1, token_list=[1, 2])


def example_args(name: str) -> tuple:
    examples = {"target": torch.nn.Linear(1, 1), "state": example_state(), "ids": [2, 5],
                "outcome": StepOutcome(Draft(torch.tensor([5])), 1, [5, 6])}
    params = list(inspect.signature(getattr(Proposer, name)).parameters)[1:]
    missing = [p for p in params if p not in examples]
    assert not missing, f"Proposer.{name} takes {missing}: give the test an example argument for it"
    return tuple(examples[p] for p in params)


def unforwarded(wrap, own=frozenset()) -> list:
    """The capabilities of Proposer that ``wrap(inner)`` does not pass on to ``inner``: a hook the
    wrapper does not call on inner with the same arguments (returning inner's result when the hook
    returns something), a flag it does not read from inner at the time it is asked; and
    "k (read)" / "k (write)" when ``wrapper.k`` does not read inner's k live, or setting it does
    not set inner's k. Each hook is called as the engine would, after ``begin``. Names in ``own``
    are the wrapper's by design and are not checked."""
    missing = []
    for name in capabilities():
        if name in own:
            continue
        inner = Spy(k=2)
        default = getattr(Proposer, name)
        if callable(default):
            args, calls = example_args(name), []
            wrapper = wrap(inner)
            if name != "begin":
                wrapper.begin(example_state())
            setattr(inner, name, lambda *a: calls.append(a) or RETURNED)
            try:
                result = getattr(wrapper, name)(*args)
            except NotImplementedError:  # the base class's own hook ran
                result = None
            returns = inspect.signature(default).return_annotation not in ("None", None)
            ok = calls == [args] and (result is RETURNED or not returns)
        else:
            wrapper = wrap(inner)
            ok = True
            for value in (object(), object()):  # changed after wrapping: read live, not copied once
                setattr(inner, name, value)
                ok = ok and getattr(wrapper, name) is value
        if not ok:
            missing.append(name)
    inner = Spy(k=2)
    wrapper = wrap(inner)
    read = write = True
    for k in (3, 5):
        inner.k = k  # e.g. a wrapper further in chose it
        read = read and wrapper.k == k
    for k in (4, 2):
        wrapper.k = k
        write = write and inner.k == k
    return missing + ["k (read)"] * (not read and "k (read)" not in own) + \
        ["k (write)"] * (not write and "k (write)" not in own)


def plant_old_forwarding(monkeypatch):
    """AdaptiveK as it first was: needs_hidden_states copied once, scores_draft and score dropped."""
    init = AdaptiveK.__init__

    def old_init(self, proposer, *args, **kwargs):
        init(self, proposer, *args, **kwargs)
        self.needs_hidden_states = proposer.needs_hidden_states

    monkeypatch.setattr(AdaptiveK, "needs_hidden_states", False, raising=False)
    monkeypatch.setattr(AdaptiveK, "scores_draft", False, raising=False)
    monkeypatch.setattr(AdaptiveK, "score", Proposer.score, raising=False)
    monkeypatch.setattr(AdaptiveK, "__init__", old_init)


def planted(name: str):
    """A ProposerWrapper that forgets exactly one thing: the capability ``name`` (the base class's
    default instead of the inner proposer's), or k, kept as its own copy for "k (read)" and
    written only to that copy for "k (write)"."""
    if name == "k (read)":
        def get(self):
            return self.__dict__.setdefault("_k", self.proposer.k)  # copied once

        def put(self, k):
            self.__dict__["_k"] = self.proposer.k = k
        body = {"k": property(get, put)}
    elif name == "k (write)":
        def put(self, k):
            self.__dict__["_k"] = k  # never reaches the inner proposer
        body = {"k": property(lambda self: self.proposer.k, put)}
    elif name == "propose":
        body = {"propose": lambda self, state: Draft.empty()}
    else:
        body = {name: vars(Proposer)[name]}
    return type("Forgets_" + name.replace(" ", "_"), (ProposerWrapper,), body)


def wrapper_classes(cls=ProposerWrapper) -> set:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | wrapper_classes(sub)
    return out


def test_capabilities_are_declared_on_the_base():
    assert {"check_compatible", "begin", "propose", "on_verified", "needs_hidden_states", "scores_draft",
            "score", "draft_sampling"} <= set(capabilities())


@pytest.mark.parametrize("wrapper", ALL_WRAPPERS)
def test_wrapper_forwards_every_capability(wrapper):
    assert unforwarded(ALL_WRAPPERS[wrapper]) == []


@pytest.mark.parametrize("wrapper", RESHAPING)
def test_reshaping_wrapper_forwards_the_rest(wrapper):
    wrap, own = RESHAPING[wrapper]
    assert unforwarded(wrap, own) == []


def test_every_wrapper_is_checked():
    """Each ProposerWrapper subclass of the package appears in ALL_WRAPPERS (a new wrapper must
    be added there to be checked)."""
    spy = Spy(k=2)
    covered = set()
    for wrap in [*ALL_WRAPPERS.values(), *(w for w, _ in RESHAPING.values())]:
        w = wrap(spy)
        while isinstance(w, ProposerWrapper):
            covered.add(type(w))
            w = w.proposer
    ours = {c for c in wrapper_classes() if c.__module__.startswith("specdecode_ref.")}
    assert ours >= {AdaptiveK, FixedK, HeuristicK, GoodputK, AcceptanceProbe}
    assert ours <= covered


def test_the_probe_asks_for_hidden_states_on_top():
    """With predict=True the probe reads the target's p from the hidden states whatever its drafter
    needs (the one flag it does not simply take from the wrapped proposer); without, it follows it."""
    assert AcceptanceProbe(NgramProposer(k=2)).needs_hidden_states
    assert not AcceptanceProbe(NgramProposer(k=2), predict=False).needs_hidden_states
    assert HeuristicK(AcceptanceProbe(NgramProposer(k=2))).needs_hidden_states


@pytest.mark.parametrize("name", capabilities() + ["k (read)", "k (write)"])
def test_forwarding_check_catches_a_planted_wrapper(name):
    assert unforwarded(ProposerWrapper) == []
    assert unforwarded(planted(name)) == [name]


def test_forwarding_check_catches_a_dropped_capability(monkeypatch):
    plant_old_forwarding(monkeypatch)
    assert unforwarded(FixedK) == ["needs_hidden_states", "score", "scores_draft"]


# ---- wrapped model-based drafters on the real model (fp32): exact, and on their fast path ----

@pytest.fixture(scope="module")
def chat(embedded):
    model, tok = embedded
    ids = chat_ids(tok, "Explain speculative decoding in two sentences.")
    return ids, autoregressive_generate(model, ids, max_new_tokens=32, stop_on_eos=False).tokens


def counting_scorer(proposer) -> list:
    """Record the length of every verification forward the proposer's own scorer runs."""
    calls, score = [], proposer.score
    proposer.score = lambda state, ids: calls.append(len(ids)) or score(state, ids)
    return calls


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_wrapped_early_exit_is_exact_and_keeps_its_scorer(embedded, chat, wrapper):
    model, _ = embedded
    ids, plain = chat
    inner = load_proposer("early-exit", model)
    calls = counting_scorer(inner)
    out = generate(model, ids, proposer=WRAPPERS[wrapper](inner), max_new_tokens=32, stop_on_eos=False)
    assert torch.equal(out.tokens, plain)
    assert out.stats.accepted > 0
    # Every verification went through early exit's scorer (first layers reused), one per step,
    # and the engine ran no forward of its own besides the prefill.
    assert calls == [n + 1 for n in out.stats.draft_lengths]
    assert out.stats.target_forwards == out.stats.steps + 1


def test_fixed_k_early_exit_matches_the_bare_drafter(embedded, chat):
    model, _ = embedded
    ids, _ = chat
    bare = generate(model, ids, proposer=load_proposer("early-exit", model), max_new_tokens=32, stop_on_eos=False)
    wrapped = generate(model, ids, proposer=FixedK(load_proposer("early-exit", model)), max_new_tokens=32,
                       stop_on_eos=False)
    assert wrapped.stats.accepted_lengths == bare.stats.accepted_lengths
    assert wrapped.stats.target_forwards == bare.stats.target_forwards


@pytest.mark.parametrize("name", ["draft", "eagle"])
def test_wrapped_model_drafters_equal_plain(embedded, chat, name):
    model, _ = embedded
    ids, plain = chat
    wrapped = HeuristicK(load_proposer(name, model))
    out = generate(model, ids, proposer=wrapped, max_new_tokens=32, stop_on_eos=False)
    assert torch.equal(out.tokens, plain)
    assert out.stats.accepted > 0 and len(set(wrapped.k_trace)) > 1  # k moved, output did not


def test_early_exit_wrapped_the_old_way_breaks(embedded, chat, monkeypatch):
    """Without its scorer, verification runs the full target over a cache whose first layers
    already hold the drafted tokens: the shapes no longer match (SDPA says so in its words, the fast
    backend's attention in its own)."""
    model, _ = embedded
    ids, _ = chat
    plant_old_forwarding(monkeypatch)
    with pytest.raises((RuntimeError, ValueError), match="size of tensor|does not cover|must be 4-D and broadcast"):
        generate(model, ids, proposer=HeuristicK(load_proposer("early-exit", model)), max_new_tokens=32)


def test_tree_drafters_are_refused_with_a_clear_error(tiny_model):
    class TreeDrafter(Proposer):
        name = "tree"

        def propose(self, state):
            return Draft(torch.tensor([1, 2, 3]), parents=torch.tensor([-1, -1, 0]))

    with pytest.raises(ValueError, match="drafts trees"):
        generate(tiny_model, torch.tensor([1, 2, 3]), proposer=HeuristicK(TreeDrafter(k=3)), max_new_tokens=8)
