"""Lab 5 grading tests (hidden): edge cases, random trees against brute force, malformed input,
the eager attention back-end, and your functions driving the course's engine."""
import itertools
import types

import pytest
import torch

from grading_lab05 import EXAMPLE, MEDUSA, as_list, check_tree_forward, logits_with_argmax, path_to, tiny_llama
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


def random_tree(n, g, bushy=0.5):
    parents = []
    for i in range(n):
        if i == 0 or float(torch.rand((), generator=g)) < bushy / (i + 1):
            parents.append(-1)
        else:
            parents.append(int(torch.randint(-1, i, (1,), generator=g)))
    return parents


def brute_visible(parents, past_len):
    n = len(parents)
    want = torch.zeros(n + 1, past_len + n + 1, dtype=torch.bool)
    want[:, : past_len + 1] = True
    for i in range(n):
        for j in path_to(parents, i):
            want[i + 1, past_len + 1 + j] = True
    return want


@points(1)
def test_depths_chain_empty_and_list(lab):
    """tree_depths: a long chain, an empty tree, and a plain list as input."""
    assert as_list(lab.tree_depths(torch.arange(12) - 1)) == list(range(1, 13))
    assert as_list(lab.tree_depths(torch.tensor([], dtype=torch.long))) == []
    assert as_list(lab.tree_depths([-1, -1, 1, 2])) == [1, 1, 2, 3]


@points(1)
def test_mask_dtype(lab):
    """tree_attention_mask honours dtype: bfloat16 / float16 masks use that dtype's finfo.min."""
    for dtype in (torch.bfloat16, torch.float16):
        m = lab.tree_attention_mask(torch.tensor([-1, 0, -1]), 1, dtype)
        assert m.dtype == dtype, f"asked for {dtype}, got {m.dtype}"
        want = brute_visible([-1, 0, -1], 1)
        assert torch.equal(m[0, 0] == 0, want)
        assert (m[0, 0][~want] == torch.finfo(dtype).min).all()


@points(2)
def test_mask_random_trees_bruteforce(lab):
    """tree_attention_mask on 30 random trees and prefix lengths, against a brute force."""
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        n = int(torch.randint(1, 16, (1,), generator=g))
        past = int(torch.randint(0, 20, (1,), generator=g))
        parents = random_tree(n, g)
        m = lab.tree_attention_mask(torch.tensor(parents), past, torch.float32)
        assert tuple(m.shape) == (1, 1, n + 1, past + n + 1)
        assert torch.equal(m[0, 0] == 0, brute_visible(parents, past)), f"parents {parents}, past_len {past}"


@points(1)
def test_position_ids_random_trees(lab):
    """tree_position_ids on random trees: depth = length of the path."""
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        n = int(torch.randint(1, 14, (1,), generator=g))
        past = int(torch.randint(0, 30, (1,), generator=g))
        parents = random_tree(n, g)
        want = [past] + [past + len(path_to(parents, i)) for i in range(n)]
        assert as_list(torch.as_tensor(lab.tree_position_ids(torch.tensor(parents), past)).reshape(-1)) == want


@points(1)
@pytest.mark.parametrize("bad", [[0], [-1, 1], [-1, 2, 0], [-1, -2]], ids=["self", "self2", "forward", "below-root"])
def test_malformed_parents(lab, bad):
    """Malformed parents (a node its own parent, a later parent, < -1) raise ValueError everywhere."""
    for call in (lambda: lab.tree_depths(torch.tensor(bad)),
                 lambda: lab.tree_attention_mask(torch.tensor(bad), 3, torch.float32),
                 lambda: lab.tree_position_ids(torch.tensor(bad), 3)):
        with pytest.raises(ValueError):
            call()


@points(2)
def test_tree_forward_eager_and_no_prefix(lab):
    """The tree forward matches the paths with eager attention too, and with an empty cache."""
    model = tiny_llama(seed=3, attn="eager")
    check_tree_forward(lab, model, MEDUSA, prefix_len=5, seed=2)
    check_tree_forward(lab, tiny_llama(seed=4), EXAMPLE, prefix_len=1, seed=3)


@points(1)
def test_greedy_full_path_and_single_node(lab):
    """The whole deepest path accepted (then the bonus token after its leaf); a one-node tree."""
    parents, toks = torch.tensor(EXAMPLE), torch.tensor([3, 4, 5, 6, 7, 1])
    path, emitted = lab.tree_greedy_verify(logits_with_argmax([3, 5, 0, 1, 0, 0, 6]), parents, toks)
    assert as_list(path) == [0, 2, 5] and as_list(emitted) == [3, 5, 1, 6]
    path, emitted = lab.tree_greedy_verify(logits_with_argmax([2, 7]), torch.tensor([-1]), torch.tensor([2]))
    assert as_list(path) == [0] and as_list(emitted) == [2, 7]


@points(1)
def test_greedy_duplicate_siblings_take_longest(lab):
    """Two children with the same token: the path goes through the one that leads deeper."""
    parents, toks = torch.tensor([-1, -1, 1]), torch.tensor([3, 3, 5])
    path, emitted = lab.tree_greedy_verify(logits_with_argmax([3, 0, 5, 2]), parents, toks)
    assert as_list(path) == [1, 2] and as_list(emitted) == [3, 5, 2]


@points(2)
def test_greedy_random_trees_bruteforce(lab):
    """tree_greedy_verify on 200 random trees and logits, against a brute force over all nodes."""
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        n = int(torch.randint(1, 10, (1,), generator=g))
        parents = random_tree(n, g, bushy=1.0)
        logits = torch.randn(n + 1, 3, generator=g)
        toks = torch.randint(0, 3, (n,), generator=g)
        best = logits.argmax(-1).tolist()
        good = [i for i in range(n) if all(int(toks[j]) == best[parents[j] + 1] for j in path_to(parents, i))]
        want = max(good, key=lambda i: (len(path_to(parents, i)), -i)) if good else None
        want_path = path_to(parents, want) if good else []
        want_emitted = [int(toks[j]) for j in want_path] + [best[want_path[-1] + 1 if want_path else 0]]
        path, emitted = lab.tree_greedy_verify(logits, torch.tensor(parents), toks)
        assert as_list(path) == want_path and as_list(emitted) == want_emitted, (
            f"parents {parents}, tokens {toks.tolist()}, argmax {best}: got {as_list(path)}, {as_list(emitted)}")


@points(3)
def test_your_functions_drive_the_engine(lab, monkeypatch):
    """With your mask, position ids and verification inside the course's engine, decoding with a
    tree draft (one branch correct up to a varying depth) equals plain greedy decoding."""
    import specdecode_ref.engine as engine
    from specdecode_ref import autoregressive_generate, generate
    from specdecode_ref.proposers import Draft, Proposer

    # The engine sees a copy of specdecode_ref.trees with your two functions in it (the package
    # module itself stays untouched: reference.py calls it).
    trees = types.SimpleNamespace(**vars(engine.trees))
    trees.tree_attention_mask = lambda p, past, dtype=torch.float32, device=None: torch.as_tensor(
        lab.tree_attention_mask(p, past, dtype))
    trees.tree_position_ids = lambda p, past, device=None: torch.as_tensor(lab.tree_position_ids(p, past)).reshape(1, -1)
    monkeypatch.setattr(engine, "trees", trees)

    def verify(logits, parents, tokens):
        path, emitted = lab.tree_greedy_verify(logits, parents, tokens)
        return torch.tensor(as_list(path), dtype=torch.long), torch.tensor(as_list(emitted), dtype=torch.long)

    monkeypatch.setattr(engine, "tree_greedy_verify", verify)
    model = tiny_llama(seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked predictions: no near-ties
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    plain = autoregressive_generate(model, prompt, max_new_tokens=40).tokens.tolist()
    reference = prompt.tolist() + plain + [0] * 8
    parents = torch.tensor(MEDUSA)
    depths = [1, 1, 1, 2, 2, 2, 2, 3, 3]
    leaves = [7, 8, 5, 6]

    class Scripted(Proposer):
        plan = itertools.cycle([(leaf, j) for j in range(4) for leaf in leaves])

        def propose(self, state):
            pos = state.num_tokens
            leaf, j = next(self.plan)
            good = set(path_to(MEDUSA, leaf)[:j])
            toks = [reference[pos + d - 1] if i in good else (reference[pos + d - 1] + 1 + i) % 64
                    for i, d in enumerate(depths)]
            return Draft(torch.tensor(toks), parents=parents.clone())

    out = generate(model, prompt, proposer=Scripted(9), max_new_tokens=40)
    assert out.tokens.tolist() == plain, "tree decoding with your functions differs from plain greedy decoding"
    assert out.stats.accepted > 0
