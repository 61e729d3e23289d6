"""Candidate trees: structure helpers, the tree attention mask, tree verification (greedy, lossless
sampling, Medusa's lossy typical acceptance) and the engine's tree path with cache compaction."""
import itertools

import numpy as np
import pytest
import torch

from specdecode_ref.backend import apply_backend, fast_available

from support import TREE_BUGS, chi2_pvalue, exact_joint, make_tiny_llama, plant, assert_law, twins
from specdecode_ref import SamplingParams, autoregressive_generate, generate, kv, trees
from specdecode_ref.proposers import Draft, Proposer
from specdecode_ref.sampling import logits_to_probs
from specdecode_ref.verify import tree_greedy_verify, tree_rejection_sample, typical_accept

# A Medusa-style tree: 3 candidates at depth 1, 4 at depth 2, 2 at depth 3 (9 nodes, depth 3).
CHOICES = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 1, 0)]
TREES = [
    [-1],                              # one node
    [-1, 0, 1, 2],                     # a chain
    [-1, -1, -1],                      # three siblings, no depth
    [-1, -1, 0, 0, 1, 2, 2, 4],        # bushy
    trees.tree_from_choices(CHOICES).parents.tolist(),
]


# --- structure -------------------------------------------------------------------------------------

def test_structure_helpers():
    p = torch.tensor([-1, -1, 0, 0, 1, 2])
    assert trees.tree_depths(p).tolist() == [1, 1, 2, 2, 2, 3]
    assert trees.children_by_slot(p) == [[0, 1], [2, 3], [4], [5], [], [], []]
    assert trees.path_to(p, 5) == [0, 2, 5]
    assert trees.root_to_leaf_paths(p) == [[0, 3], [1, 4], [0, 2, 5]]
    a = trees.ancestor_matrix(p)
    assert a[5].nonzero().flatten().tolist() == [0, 2, 5] and a[1].nonzero().flatten().tolist() == [1]
    assert trees.chain_parents(4).tolist() == [-1, 0, 1, 2] and trees.chain_parents(0).numel() == 0
    assert trees.root_to_leaf_paths(trees.chain_parents(3)) == [[0, 1, 2]]
    assert trees.kept_positions(3, [0, 2]).tolist() == [0, 1, 2, 3, 4, 6]
    assert "node 5" in trees.tree_to_text(p)


def test_tree_from_choices_medusa_style():
    t = trees.tree_from_choices([(0, 1), (1,), (0,), (0, 0), (0, 0, 0)])
    assert t.choices == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]  # by depth, then lexicographic
    assert t.parents.tolist() == [-1, -1, 0, 0, 2]
    assert t.ranks.tolist() == [0, 1, 0, 1, 0]
    with pytest.raises(ValueError, match="no parent"):
        trees.tree_from_choices([(0,), (1, 0)])
    with pytest.raises(ValueError, match="twice"):
        trees.tree_from_choices([(0,), (0,)])
    with pytest.raises(ValueError, match="root"):
        trees.tree_from_choices([()])


def test_clip_tree():
    p = torch.tensor([-1, -1, 0, 0, 1, 2])
    new, keep = trees.clip_tree(p, max_depth=2)
    assert keep.tolist() == [0, 1, 2, 3, 4] and new.tolist() == [-1, -1, 0, 0, 1]
    new, keep = trees.clip_tree(p, max_depth=1)
    assert keep.tolist() == [0, 1] and new.tolist() == [-1, -1]
    new, keep = trees.clip_tree([-1, 0, -1, 2, 1], max_depth=2)
    assert keep.tolist() == [0, 1, 2, 3] and new.tolist() == [-1, 0, -1, 2]
    new, keep = trees.clip_tree(p, max_nodes=3)
    assert new.tolist() == [-1, -1, 0]
    assert trees.clip_tree(p, max_depth=0)[1].numel() == 0


@pytest.mark.parametrize("bad,match", [
    ([0], "earlier"),                 # a node is its own parent
    ([-1, 2, 0], "earlier"),          # points forward
    ([-1, -2], "root"),               # below -1
    ([[-1, 0]], "1-D"),
])
def test_malformed_parents_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        trees.validate_parents(torch.tensor(bad))
    with pytest.raises(ValueError, match=match):
        trees.tree_attention_mask(torch.tensor(bad), 4)


def test_malformed_inputs_more_errors():
    with pytest.raises(TypeError, match="integer"):
        trees.validate_parents(torch.tensor([-1.0, 0.0]))
    with pytest.raises(TypeError, match="integer"):
        trees.validate_parents([-1, 0.5])
    with pytest.raises(ValueError, match="2 entries for 3"):
        trees.validate_parents([-1, 0], n=3)
    with pytest.raises(ValueError, match="past_len"):
        trees.tree_position_ids([-1], -1)
    logits = torch.randn(3, 10)
    with pytest.raises(ValueError, match="rows"):
        tree_greedy_verify(logits, torch.tensor([-1, 0, 1]), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="entries"):
        tree_greedy_verify(logits, torch.tensor([-1]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="vocabulary"):
        tree_rejection_sample(logits.softmax(-1), torch.tensor([-1, 0]), torch.tensor([1, 12]))
    with pytest.raises(ValueError, match="draft_probs"):
        tree_rejection_sample(logits.softmax(-1), torch.tensor([-1, 0]), torch.tensor([1, 2]),
                              draft_probs=torch.rand(3, 10))


# --- the mask and the position ids --------------------------------------------------------------

def test_mask_and_positions_small_example():
    p = torch.tensor([-1, -1, 0])  # root -> {0, 1}, 0 -> 2
    vis = trees.tree_visibility(p, past_len=2)
    want = torch.tensor([
        # past  root n0 n1 n2
        [1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 0, 0],  # node 0
        [1, 1, 1, 0, 1, 0],  # node 1: not its sibling
        [1, 1, 1, 1, 0, 1],  # node 2: root, node 0, itself
    ], dtype=torch.bool)
    assert torch.equal(vis, want)
    m = trees.tree_attention_mask(p, 2, dtype=torch.float16)
    assert m.shape == (1, 1, 4, 6) and m.dtype == torch.float16
    assert torch.equal(m[0, 0] == 0, want) and (m[0, 0][~want] == torch.finfo(torch.float16).min).all()
    assert trees.tree_position_ids(p, 2).tolist() == [[2, 3, 3, 4]]
    # A chain is the ordinary causal mask with consecutive positions.
    chain = trees.tree_visibility(trees.chain_parents(3), past_len=1)
    assert torch.equal(chain, torch.ones(4, 5, dtype=torch.bool).tril(diagonal=1))
    assert trees.tree_position_ids(trees.chain_parents(3), 1).tolist() == [[1, 2, 3, 4]]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_llama(vocab_size=64, sharpness=8.0)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "fast"])
@pytest.mark.parametrize("parents", TREES, ids=["one", "chain", "siblings", "bushy", "medusa"])
def test_tree_forward_equals_path_forward(parents, attn):
    """Brute force: the tree forward's logits at every node equal those of the node's
    root-to-node path run as a plain sequence (and the root's those of the prefix). "fast" is the
    fast backend's kernels (backend.py), attention included."""
    model = make_tiny_llama(vocab_size=64, sharpness=8.0, seed=1)
    if attn == "fast":
        ok, why = fast_available()
        if not ok:
            pytest.skip(f"the fast backend cannot run here: {why}")
        apply_backend(model, "fast")
    else:
        apply_backend(model, "eager")
        model.set_attn_implementation(attn)
    parents = torch.tensor(parents)
    g = torch.Generator().manual_seed(len(parents))
    toks = torch.randint(0, 64, (len(parents),), generator=g)
    for prefix_len in (1, 7):  # past_len 0 (only the root) and 6
        prefix = torch.randint(0, 64, (prefix_len,), generator=g)
        cache = kv.new_cache(model)
        with torch.no_grad():
            if prefix_len > 1:
                model(input_ids=prefix[None, :-1], past_key_values=cache, use_cache=True)
            past = kv.cache_len(cache)
            out = model(input_ids=torch.cat([prefix[-1:], toks])[None], past_key_values=cache, use_cache=True,
                        attention_mask=trees.tree_attention_mask(parents, past),
                        position_ids=trees.tree_position_ids(parents, past)).logits[0]
            ref_root = model(input_ids=prefix[None]).logits[0, -1]
            torch.testing.assert_close(out[0], ref_root, atol=1e-5, rtol=1e-5)
            for i in range(len(parents)):
                seq = torch.cat([prefix, toks[trees.path_to(parents, i)]])
                ref = model(input_ids=seq[None]).logits[0, -1]
                torch.testing.assert_close(out[i + 1], ref, atol=1e-5, rtol=1e-5, msg=f"node {i}")


def test_compacted_cache_equals_plain_feed(tiny):
    """After a tree forward, keeping prefix + root + accepted path gives the cache of the accepted
    sequence fed plainly (keys carry rotary positions, so this checks the position ids too)."""
    parents = trees.tree_from_choices(CHOICES).parents
    toks = torch.arange(10, 10 + len(parents))
    prefix = torch.tensor([5, 9, 2, 6, 5, 3])
    for path in trees.root_to_leaf_paths(parents) + [[], [1], [0, 3]]:
        cache = kv.new_cache(tiny)
        with torch.no_grad():
            tiny(input_ids=prefix[None, :-1], past_key_values=cache, use_cache=True)
            past = kv.cache_len(cache)
            tiny(input_ids=torch.cat([prefix[-1:], toks])[None], past_key_values=cache, use_cache=True,
                 attention_mask=trees.tree_attention_mask(parents, past),
                 position_ids=trees.tree_position_ids(parents, past))
            kv.keep_positions(cache, trees.kept_positions(past, path))
            fresh = kv.new_cache(tiny)
            tiny(input_ids=torch.cat([prefix, toks[path]])[None], past_key_values=fresh, use_cache=True)
        assert kv.cache_len(cache) == kv.cache_len(fresh) == len(prefix) + len(path)
        for a, b in zip(cache.layers, fresh.layers):
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


# --- greedy verification --------------------------------------------------------------------------

def _logits_with_argmax(argmax, v=8):
    logits = torch.zeros(len(argmax), v)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


def test_tree_greedy_verify_cases():
    parents = torch.tensor([-1, -1, 0, 0, 1, 2])
    toks = torch.tensor([3, 4, 5, 6, 7, 1])
    # argmax per slot: root, n0, n1, n2, n3, n4, n5
    cases = [
        ([4, 6, 7, 0, 0, 0, 0], [1, 4], [4, 7, 0]),      # second branch, to its leaf: bonus after n4
        ([3, 5, 0, 1, 0, 0, 2], [0, 2, 5], [3, 5, 1, 2]),  # the deepest path
        ([3, 6, 0, 0, 0, 0, 0], [0, 3], [3, 6, 0]),
        ([3, 2, 0, 0, 0, 0, 0], [0], [3, 2]),            # node 0 accepted, none of its children
        ([0, 0, 0, 0, 0, 0, 0], [], [0]),                # nothing accepted
    ]
    for argmax, path, emitted in cases:
        got_path, got = tree_greedy_verify(_logits_with_argmax(argmax), parents, toks)
        assert got_path.tolist() == path and got.tolist() == emitted, (argmax, got_path, got)


def test_tree_greedy_prefers_longest_path_among_duplicates():
    parents = torch.tensor([-1, -1, 1])  # two children with the same token; only the second has a child
    toks = torch.tensor([3, 3, 5])
    path, emitted = tree_greedy_verify(_logits_with_argmax([3, 0, 5, 2]), parents, toks)
    assert path.tolist() == [1, 2] and emitted.tolist() == [3, 5, 2]


def test_chain_tree_equals_greedy_verify():
    from specdecode_ref.verify import greedy_verify

    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        k = int(torch.randint(1, 6, (1,), generator=g))
        logits = torch.randn(k + 1, 5, generator=g)
        draft = torch.randint(0, 5, (k,), generator=g)
        out, acc = greedy_verify(logits[None], draft[None])
        path, emitted = tree_greedy_verify(logits, trees.chain_parents(k), draft)
        assert len(path) == int(acc[0]) and emitted.tolist() == out[0, : int(acc[0]) + 1].tolist()


# --- sampling: lossless multi-candidate rejection vs typical acceptance ------------------------------

V = 5
_g = torch.Generator().manual_seed(7)
P_WORLD = torch.softmax(torch.randn(V, V, generator=_g) * 1.5, -1)  # target: p(next | last)
P_WORLD[0, 3] = 0.0  # a zero in p: must never be emitted after token 0
P_WORLD = P_WORLD / P_WORLD.sum(-1, keepdim=True)
Q_WORLD = torch.softmax(torch.randn(V, V, generator=_g) * 1.5, -1)  # a drafter that is wrong


def _toy_tree(last, parents, mode, g):
    """Tokens for a tree over the Markov toy world: deterministic top-k of q per parent, or i.i.d.
    samples from q at the parent (then with draft_probs)."""
    parents = parents.tolist()
    toks, qrows, rank = [], [], {}
    for i, par in enumerate(parents):
        ctx = last if par < 0 else toks[par]
        q = Q_WORLD[ctx]
        if mode == "topk":
            r = rank.get(par, 0)
            rank[par] = r + 1
            toks.append(int(torch.argsort(q, descending=True)[r]))
        else:
            toks.append(int(torch.multinomial(q, 1, generator=g)))
        qrows.append(q)
    return torch.tensor(toks), torch.stack(qrows)


def _toy_decode(verifier, parents, mode, seed, steps=3, last=1):
    """Speculative decoding over the toy world until `steps` tokens are out; the target's rows
    are p(. | the slot's token), as a transformer would give them for that path."""
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < steps:
        toks, qrows = _toy_tree(last, parents, mode, g)
        rows = torch.stack([P_WORLD[last]] + [P_WORLD[t] for t in toks.tolist()])
        if verifier is typical_accept:
            _, emitted = verifier(rows, parents, toks, g)
        else:
            _, emitted = verifier(rows, parents, toks, g, qrows if mode == "sampled" else None)
        out += emitted.tolist()
        last = out[-1]
    return out[:steps]


def _toy_joint(steps=3, last=1):
    joint = np.zeros((V,) * steps)
    for seq in itertools.product(range(V), repeat=steps):
        prob, prev = 1.0, last
        for t in seq:
            prob *= float(P_WORLD[prev, t])
            prev = t
        joint[seq] = prob
    return joint.ravel()


def _toy_pvalue(verifier, parents, mode, n):
    counts = np.zeros(V ** 3)
    for seed in range(n):
        counts[np.ravel_multi_index(_toy_decode(verifier, parents, mode, seed), (V,) * 3)] += 1
    return chi2_pvalue(counts, _toy_joint())


@pytest.mark.parametrize("parents,mode", [
    ([-1, -1, -1], "topk"),                   # three distinct candidates at one node
    ([-1, -1, 0, 0, 1], "topk"),              # two levels, several children
    ([-1, -1, -1, 0, 0, 3], "sampled"),       # i.i.d. samples from q (duplicates happen), draft_probs
    ([-1, 0, 1], "sampled"),                  # a chain with draft_probs
])
@twins("resample_from_p")
def test_tree_rejection_sample_is_lossless(parents, mode, bug):
    """The joint law of the first three emitted tokens equals the target's (chi-square); the twin
    (tests/support.tree_resample_from_p: no residual update) fails at the same size."""
    verifier = tree_rejection_sample if bug is None else TREE_BUGS[bug]
    assert_law(_toy_pvalue(verifier, torch.tensor(parents), mode, n=4000), bug)


def test_typical_acceptance_is_lossy():
    """Planted-bug style: Medusa's typical acceptance fails the same test by a mile."""
    assert _toy_pvalue(typical_accept, torch.tensor([-1, -1, 0, 0, 1]), "topk", n=4000) < 1e-6


def test_tree_rejection_sample_one_step_first_token():
    """One verification: the first emitted token follows p at the root, for top-k children."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    rows = torch.stack([p] + [torch.full((5,), 0.2)] * 3)
    parents, toks = torch.tensor([-1, -1, -1]), torch.tensor([1, 4, 2])  # includes a p = 0 candidate
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(5)
    for _ in range(20000):
        counts[int(tree_rejection_sample(rows, parents, toks, g)[1][0])] += 1
    assert chi2_pvalue(counts, p.numpy()) > 1e-3


def test_typical_threshold_rule():
    p = torch.tensor([0.6, 0.3, 0.08, 0.02])
    h = float(-(p * p.log()).sum())
    thr = min(0.09, 0.3 * np.exp(-h))
    rows = torch.stack([p, torch.full((4,), 0.25)])
    for tok in range(4):
        path, _ = typical_accept(rows, torch.tensor([-1]), torch.tensor([tok]), torch.Generator().manual_seed(0))
        assert (len(path) == 1) == (float(p[tok]) > thr)
    # greedy (one-hot) p: typical acceptance is greedy verification
    onehot = torch.eye(4)[[1, 2, 0]]
    path, emitted = typical_accept(onehot, torch.tensor([-1, 0]), torch.tensor([1, 2]))
    assert path.tolist() == [0, 1] and emitted.tolist() == [1, 2, 0]


def test_typical_tie_broken_by_likelihood():
    """Two equally long typical paths: the one whose tokens the target finds more likely wins (the
    sum of log p over the path, Medusa's evaluate_posterior), not the first in node order."""
    p_root = torch.tensor([0.1, 0.2, 0.6, 0.1])  # hesitant: the threshold is below 0.09
    rows = torch.stack([p_root, torch.full((4,), 0.25), torch.full((4,), 0.25)])
    # depth 1 only: tokens 1 (p 0.2, first) and 2 (p 0.6) are both typical; 2 must win
    path, emitted = typical_accept(rows, torch.tensor([-1, -1]), torch.tensor([1, 2]), torch.Generator().manual_seed(0))
    assert path.tolist() == [1] and emitted[0] == 2
    # depth 2, equal lengths: the sum over the whole path decides, not the first level alone
    a, b = torch.tensor([0.05, 0.5, 0.35, 0.1]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    rows = torch.stack([torch.tensor([0.1, 0.45, 0.35, 0.1]), a, b, torch.full((4,), 0.25), torch.full((4,), 0.25)])
    parents, toks = torch.tensor([-1, -1, 0, 1]), torch.tensor([1, 2, 2, 3])
    # path via node 0: 0.45 * 0.35 = 0.1575; via node 1: 0.35 * 0.4 = 0.14 -> node 0's path
    path, _ = typical_accept(rows, parents, toks, torch.Generator().manual_seed(0))
    assert path.tolist() == [0, 2]
    rows[1] = torch.tensor([0.05, 0.5, 0.3, 0.15])  # now 0.45 * 0.3 = 0.135 < 0.14 -> node 1's path
    path, _ = typical_accept(rows, parents, toks, torch.Generator().manual_seed(0))
    assert path.tolist() == [1, 3]
    # a longer typical path still beats a shorter, more likely one: node 0 (token 2, p 0.35) has a
    # typical child, node 1 (token 1, p 0.45) has none
    path, _ = typical_accept(rows[:4], torch.tensor([-1, -1, 0]), torch.tensor([2, 1, 2]),
                             torch.Generator().manual_seed(0))
    assert path.tolist() == [0, 2]


def test_tree_sampling_uses_only_the_generator():
    p = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), -1)
    args = (p, torch.tensor([-1, -1, 0]), torch.tensor([1, 2, 3]))
    torch.manual_seed(0)
    a = [tree_rejection_sample(*args, torch.Generator().manual_seed(s))[1].tolist() for s in range(30)]
    torch.manual_seed(123)
    b = [tree_rejection_sample(*args, torch.Generator().manual_seed(s))[1].tolist() for s in range(30)]
    assert a == b


# --- the engine ----------------------------------------------------------------------------------

class ScriptedTreeProposer(Proposer):
    """Drafts a fixed tree whose one branch carries the target's greedy continuation up to a
    chosen depth (every other node is wrong), cycling through branches and depths so that every
    acceptance length and many branches occur. Checks what the engine hands back."""

    needs_hidden_states = True

    def __init__(self, reference, choices, vocab, hidden_size):
        self.tree = trees.tree_from_choices(choices)
        super().__init__(len(self.tree.choices))
        self.reference, self.vocab, self.hidden_size = reference, vocab, hidden_size
        self.paths = trees.root_to_leaf_paths(self.tree.parents)
        self.depths = trees.tree_depths(self.tree.parents).tolist()
        self.plan = itertools.cycle([(leaf, j) for j in range(max(self.depths) + 1)
                                     for leaf in range(len(self.paths))])
        self.expected, self.seen, self.accepted_nodes = [], [], []
        self.clip_checks = []  # (max depth the engine verified, tokens committed before the step)

    def propose(self, state):
        pos = state.num_tokens
        assert state.token_list == self.reference[:pos], "engine state diverged from greedy"
        leaf, j = next(self.plan)
        path = self.paths[leaf]
        good = set(path[:j])
        toks = []
        for i, d in enumerate(self.depths):
            truth = self.reference[pos + d - 1]
            toks.append(truth if i in good else (truth + 1 + i) % self.vocab)
        self.expected.append(path[: min(j, len(path))])
        return Draft(torch.tensor(toks), parents=self.tree.parents.clone())

    def on_verified(self, state, outcome):
        self.seen.append(outcome.num_accepted)
        self.accepted_nodes.append(outcome.accepted_nodes)
        d = outcome.draft
        depth = int(trees.tree_depths(d.parents).max()) if len(d) else 0
        self.clip_checks.append((depth, state.num_tokens - len(outcome.emitted)))
        assert all(h.shape == (outcome.num_accepted + 1, self.hidden_size) for h in outcome.hidden_states)


def test_greedy_tree_engine_equals_plain_tiny(tiny):
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    plain = autoregressive_generate(tiny, prompt, max_new_tokens=80)
    reference = prompt.tolist() + plain.tokens.tolist() + [0] * 8
    proposer = ScriptedTreeProposer(reference, CHOICES, 64, tiny.config.hidden_size)
    out = generate(tiny, prompt, proposer=proposer, max_new_tokens=80)
    assert out.tokens.tolist() == plain.tokens.tolist()
    assert set(proposer.seen) == {0, 1, 2, 3}
    # away from the end (where the budget clips the tree) the accepted path is the planted one
    for want, got in list(zip(proposer.expected, proposer.accepted_nodes))[:-3]:
        assert got == want
    assert len({tuple(p) for p in proposer.accepted_nodes}) >= 6  # many different branches accepted
    s = out.stats
    assert len(CHOICES) * (s.steps - 3) <= s.drafted <= len(CHOICES) * s.steps  # nodes per step
    assert s.accepted == sum(proposer.seen) == out.token_kinds.count("accepted")
    assert s.emitted + 1 == len(out.tokens) == len(out.token_kinds)
    assert {"bonus", "recovered", "accepted"} <= set(out.token_kinds)


def test_tree_engine_stats_and_kinds(tiny):
    prompt = torch.tensor([2, 7, 1, 8, 2, 8])
    plain = autoregressive_generate(tiny, prompt, max_new_tokens=40)
    reference = prompt.tolist() + plain.tokens.tolist() + [0] * 8
    proposer = ScriptedTreeProposer(reference, CHOICES, 64, tiny.config.hidden_size)
    out = generate(tiny, prompt, proposer=proposer, max_new_tokens=40)
    s = out.stats
    assert out.tokens.tolist() == plain.tokens.tolist()
    assert s.drafted == sum(s.draft_lengths) and max(s.draft_lengths) == len(CHOICES)  # nodes per step
    assert s.accepted_lengths == proposer.seen and s.target_forwards == s.steps + 1
    pos = 1  # the first token comes from the prefill
    for acc, nodes in zip(proposer.seen[:-1], proposer.accepted_nodes):
        kinds = out.token_kinds[pos: pos + acc + 1]
        assert kinds[:acc] == ["accepted"] * acc
        if len(kinds) == acc + 1:  # the step's last token: bonus after a leaf, else recovered
            leaf = bool(nodes) and not trees.children_by_slot(proposer.tree.parents)[nodes[-1] + 1]
            assert kinds[-1] == ("bonus" if leaf else "recovered")
        pos += acc + 1
    assert out.token_kinds[-1] == "target"  # the last step: the budget clipped the tree to nothing


@pytest.mark.parametrize("n", [2, 3, 5])
def test_tree_clipped_to_token_budget(tiny, n):
    prompt = torch.tensor([5, 6, 7, 5, 6, 7])
    plain = autoregressive_generate(tiny, prompt, max_new_tokens=n)
    reference = prompt.tolist() + plain.tokens.tolist() + [0] * 8
    proposer = ScriptedTreeProposer(reference, CHOICES, 64, tiny.config.hidden_size)
    proposer.plan = itertools.repeat((len(proposer.paths) - 1, 3))  # always the deepest branch, all correct
    out = generate(tiny, prompt, proposer=proposer, max_new_tokens=n)
    assert out.tokens.tolist() == plain.tokens.tolist() and len(out.tokens) == n
    new_before = [before - len(prompt) for _, before in proposer.clip_checks]
    assert all(depth <= n - nb - 1 for (depth, _), nb in zip(proposer.clip_checks, new_before))
    assert proposer.clip_checks[0][0] == min(3, n - 2)  # the deep tree is cut, not dropped


def test_tree_clipped_to_context_window(tiny):
    window = tiny.config.max_position_embeddings
    prompt = torch.arange(window - 4) % 64
    plain = autoregressive_generate(tiny, prompt, max_new_tokens=4)
    reference = prompt.tolist() + plain.tokens.tolist() + [0] * 8
    proposer = ScriptedTreeProposer(reference, CHOICES, 64, tiny.config.hidden_size)
    out = generate(tiny, prompt, proposer=proposer, max_new_tokens=4)
    assert out.tokens.tolist() == plain.tokens.tolist()
    assert all(before + depth <= window for depth, before in proposer.clip_checks)


class BadTreeProposer(Proposer):
    def propose(self, state):
        return Draft(torch.tensor([1, 2]), parents=torch.tensor([1, -1]))


def test_engine_rejects_malformed_tree(tiny):
    with pytest.raises(ValueError, match="earlier"):
        generate(tiny, torch.tensor([1, 2, 3]), proposer=BadTreeProposer(2), max_new_tokens=5)
    with pytest.raises(ValueError, match="tree_acceptance"):
        generate(tiny, torch.tensor([1, 2, 3]), max_new_tokens=5, tree_acceptance="fast")


class TopKTreeProposer(Proposer):
    """A model-free tree drafter for sampling tests: a fixed q per last token; children either the
    top-k of q at their parent (deterministic) or i.i.d. samples from it (with draft_probs)."""

    def __init__(self, parents, vocab, mode, seed=0):
        super().__init__(len(parents))
        self.parents = torch.tensor(parents)
        g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(torch.randn(vocab, vocab, generator=g) * 2, -1)
        self.mode = mode

    def propose(self, state):
        toks, rows, rank = [], [], {}
        for i, par in enumerate(self.parents.tolist()):
            ctx = state.token_list[-1] if par < 0 else toks[par]
            q = logits_to_probs(self.q[ctx].log(), state.sampling)
            if self.mode == "topk":
                rank[par] = rank.get(par, -1) + 1
                toks.append(int(torch.argsort(q, descending=True)[rank[par]]))
            else:
                toks.append(int(torch.multinomial(q, 1, generator=state.generator)))
            rows.append(q)
        probs = torch.stack(rows) if self.mode == "sampled" else None
        return Draft(torch.tensor(toks), probs=probs, parents=self.parents.clone())


@pytest.fixture(scope="module")
def small_vocab_model():
    return make_tiny_llama(vocab_size=6, sharpness=3.0, seed=2)


def _engine_joint_pvalue(model, proposer_factory, sampling, n=2500, steps=3, **kw):
    prompt = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    v = model.config.vocab_size
    counts = np.zeros(v ** steps)
    for seed in range(n):
        toks = generate(model, prompt, proposer=proposer_factory(), max_new_tokens=steps, sampling=sampling,
                        seed=seed, **kw).tokens.tolist()
        counts[np.ravel_multi_index(toks, (v,) * steps)] += 1
    return chi2_pvalue(counts, exact_joint(model, prompt, steps, sampling))


@pytest.mark.parametrize("mode,sampling", [
    ("topk", SamplingParams(temperature=1.0)),
    ("sampled", SamplingParams(temperature=0.8, top_k=4)),
])
@twins("bonus_off_by_one")
def test_sampled_tree_engine_follows_target_joint(small_vocab_model, mode, sampling, bug, monkeypatch):
    plant(monkeypatch, bug)
    factory = lambda: TopKTreeProposer([-1, -1, 0, 0, 1], 6, mode)  # noqa: E731
    assert_law(_engine_joint_pvalue(small_vocab_model, factory, sampling), bug)


def test_typical_engine_is_lossy(small_vocab_model):
    factory = lambda: TopKTreeProposer([-1, -1, 0, 0, 1], 6, "topk")  # noqa: E731
    p = _engine_joint_pvalue(small_vocab_model, factory, SamplingParams(temperature=1.0), n=1500,
                             tree_acceptance="typical")
    assert p < 1e-6


def test_greedy_tree_engine_equals_plain_embedded(embedded):
    """The real model in fp32, two short prompts: a tree draft gives plain greedy output."""
    from specdecode_ref import chat_ids

    model, tok = embedded
    for text in ["Name three primary colours.", "Write a Python function that adds two numbers."]:
        ids = chat_ids(tok, text)
        plain = autoregressive_generate(model, ids, max_new_tokens=24, stop_on_eos=False)
        reference = ids.tolist() + plain.tokens.tolist() + [0] * 8
        proposer = ScriptedTreeProposer(reference, [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
                                        model.config.vocab_size, model.config.hidden_size)
        out = generate(model, ids, proposer=proposer, max_new_tokens=24, stop_on_eos=False)
        assert out.tokens.tolist() == plain.tokens.tolist()
        assert set(proposer.seen) >= {0, 1, 2}
