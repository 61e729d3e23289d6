"""Lab 5 grading tests (visible): the checks the notebook walks you through.

Run them with ``python -m specdecode_ref.grading labs/lab05_tree_attention --visible-only``
(your student.py) or add ``--reference``.
"""
import torch

from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)
REFERENCE_PATTERNS = [r"specdecode_ref\.(trees|verify)\b[^\n]*|from specdecode_ref import[^\n]*\btrees\b"]

EXAMPLE = [-1, -1, 0, 0, 1, 2]  # root -> {0, 1}; 0 -> {2, 3}; 1 -> {4}; 2 -> {5}
MEDUSA = [-1, -1, -1, 0, 0, 1, 2, 3, 4]  # a Medusa-style tree: 3 + 4 + 2 nodes


def as_list(x):
    return [int(v) for v in (x.tolist() if isinstance(x, torch.Tensor) else x)]


def tiny_llama(seed=0, attn="sdpa"):
    """A 2-layer random Llama (vocabulary 64): fast enough for many forwards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation(attn)
    return model


def path_to(parents, i):
    path = [i]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    return path[::-1]


def check_tree_forward(lab, model, parents, prefix_len, seed=0):
    """Tree forward with the lab's mask and position ids == every path run as a plain sequence."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 64, (len(parents),), generator=g)
    prefix = torch.randint(0, 64, (prefix_len,), generator=g)
    cache = DynamicCache()
    with torch.no_grad():
        if prefix_len > 1:
            model(input_ids=prefix[None, :-1], past_key_values=cache, use_cache=True)
        past = prefix_len - 1
        mask = lab.tree_attention_mask(torch.tensor(parents), past, torch.float32)
        pos = lab.tree_position_ids(torch.tensor(parents), past)
        out = model(input_ids=torch.cat([prefix[-1:], toks])[None], past_key_values=cache, use_cache=True,
                    attention_mask=mask, position_ids=torch.as_tensor(pos).reshape(1, -1)).logits[0]
        ref = model(input_ids=prefix[None]).logits[0, -1]
        assert torch.allclose(out[0], ref, atol=1e-5), "the root's logits differ from the prefix's"
        for i in range(len(parents)):
            seq = torch.cat([prefix, toks[path_to(parents, i)]])
            ref = model(input_ids=seq[None]).logits[0, -1]
            diff = float((out[i + 1] - ref).abs().max())
            assert diff < 1e-5, (f"node {i} (path {path_to(parents, i)}): tree logits differ from the path run "
                                 f"as a plain sequence by {diff:.3g}")


def logits_with_argmax(argmax, v=8):
    logits = torch.zeros(len(argmax), v)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


@points(1)
def test_depths_example(lab):
    """tree_depths: 1 under the root, parent's depth + 1 below."""
    assert as_list(lab.tree_depths(torch.tensor(EXAMPLE))) == [1, 1, 2, 2, 2, 3]
    assert as_list(lab.tree_depths(torch.tensor(MEDUSA))) == [1, 1, 1, 2, 2, 2, 2, 3, 3]


@points(2)
def test_mask_small_example(lab):
    """tree_attention_mask: shape, 0 where visible, finfo.min elsewhere, on a 3-node tree."""
    m = lab.tree_attention_mask(torch.tensor([-1, -1, 0]), 2, torch.float32)
    assert tuple(m.shape) == (1, 1, 4, 6), f"shape {tuple(m.shape)}, want (1, 1, n+1, past_len+n+1) = (1, 1, 4, 6)"
    assert m.dtype == torch.float32
    want = torch.tensor([
        # prefix root n0 n1 n2
        [1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 0, 0],  # node 0
        [1, 1, 1, 0, 1, 0],  # node 1: not its sibling
        [1, 1, 1, 1, 0, 1],  # node 2: root, its parent node 0, itself
    ], dtype=torch.bool)
    visible = m[0, 0] == 0
    assert torch.equal(visible, want), f"visible entries (1 = 0.0 in the mask):\n{visible.int()}\nwant:\n{want.int()}"
    assert (m[0, 0][~want] == torch.finfo(torch.float32).min).all(), "hidden entries must be torch.finfo(dtype).min"


@points(1)
def test_mask_chain_is_causal(lab):
    """For a chain the tree mask is the ordinary causal mask."""
    m = lab.tree_attention_mask(torch.tensor([-1, 0, 1, 2]), 3, torch.float32)
    assert tuple(m.shape) == (1, 1, 5, 8)
    assert torch.equal(m[0, 0] == 0, torch.ones(5, 8, dtype=torch.bool).tril(diagonal=3))


@points(1)
def test_position_ids_example(lab):
    """tree_position_ids: the root at past_len, node i at past_len + depth(i)."""
    pos = lab.tree_position_ids(torch.tensor(EXAMPLE), 5)
    assert tuple(torch.as_tensor(pos).shape) == (1, 7), f"shape {tuple(torch.as_tensor(pos).shape)}, want (1, n+1)"
    assert as_list(torch.as_tensor(pos)[0]) == [5, 6, 6, 7, 7, 7, 8]


@points(3)
def test_tree_forward_matches_paths(lab):
    """With your mask and position ids, one tree forward gives every node the logits of its path."""
    model = tiny_llama()
    check_tree_forward(lab, model, MEDUSA, prefix_len=6)
    check_tree_forward(lab, model, EXAMPLE, prefix_len=9, seed=1)


@points(2)
def test_greedy_path_examples(lab):
    """tree_greedy_verify: the longest all-correct path, then the target's next token."""
    parents, toks = torch.tensor(EXAMPLE), torch.tensor([3, 4, 5, 6, 7, 1])
    cases = [  # argmax per slot (root, node 0, ..., node 5) -> accepted nodes, emitted tokens
        ([4, 6, 7, 0, 0, 0, 0], [1, 4], [4, 7, 0]),
        ([3, 5, 0, 1, 0, 0, 2], [0, 2, 5], [3, 5, 1, 2]),
        ([3, 2, 0, 0, 0, 0, 0], [0], [3, 2]),
        ([0, 0, 0, 0, 0, 0, 0], [], [0]),
    ]
    for argmax, want_path, want_emitted in cases:
        path, emitted = lab.tree_greedy_verify(logits_with_argmax(argmax), parents, toks)
        assert as_list(path) == want_path and as_list(emitted) == want_emitted, (
            f"argmax per slot {argmax}: got {as_list(path)}, {as_list(emitted)}; want {want_path}, {want_emitted}")
