"""Candidate trees: verify several guesses in one target forward with tree attention.

A chain draft bets everything on one continuation: the first wrong token throws the rest away.
A *tree* draft offers several candidates at each position (Medusa's top-k per head, EAGLE's
dynamic tree, SpecInfer's token tree) and the target scores all of them in **one** forward. That
works because attention only needs each token to see its own ancestors: pack the tree's nodes in
one sequence after the last committed token (the **root**), give every node the position id of
its depth, and mask every node's attention down to the committed prefix plus its root-to-node
path. Each node's logits are then exactly those the target would give the path as a plain
sequence; siblings never see each other.

Representation: ``parents``, a LongTensor [n] of parent indices. ``parents[i] = ROOT`` (-1) means
node i hangs directly under the root (the last committed token, which the target re-reads at the
start of every step); otherwise ``parents[i] = j < i``. Pointing only backwards makes the order
topological (a parent always comes before its children), so any prefix of the nodes is itself a
tree, and a chain of n tokens is ``[-1, 0, 1, ..., n-2]``. Every function here takes ``parents``
as [n] (a LongTensor or a sequence of ints, checked by :func:`validate_parents`).

**Slots.** The target forward reads ``[root] + nodes``: slot 0 is the root and slot ``i + 1`` is
node i. Row s of the target's logits predicts the token *after* slot s, so a node is checked
against the row of its parent's slot, ``parents[i] + 1``.

The package keeps the committed prefix in the KV cache (``past_len`` positions, the root not
included); after verification the cache is compacted (``kv.keep_positions``) to the prefix, the
root and the accepted path, which then sits at consecutive positions exactly as if it had been
fed as a chain (the rotary positions of the path's keys are their depths, i.e. consecutive).

Counterparts: Medusa ``medusa/model/utils.py`` (``generate_medusa_buffers``: the same mask,
position ids and retrieve indices built from ``medusa_choices``), EAGLE ``eagle/model/utils.py``
(dynamic trees from the drafter's scores), SpecInfer (Miao et al. 2023, "token tree
verification"), vLLM ``vllm/v1/spec_decode/`` tree attention.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

# The parent index of a node that hangs directly under the root. -1 so that ``parents[i] + 1`` is
# always the parent's slot (the root is slot 0) and a chain is ``arange(n) - 1``.
ROOT = -1


# --------------------------------------------------------------------------------------------
# Structure: parents, depths, ancestors, children, paths.
# --------------------------------------------------------------------------------------------

def validate_parents(parents, n: int | None = None) -> torch.Tensor:
    """``parents`` as a 1-D LongTensor on the CPU, after checking it describes a tree.

    Every entry must be ROOT (a child of the root) or the index of an *earlier* node: that rules
    out cycles and self-loops and makes the node order topological. ``n``, when given, is the
    number of draft tokens the parents must match. Raises ValueError (TypeError for non-integer
    input) with the offending index.
    """
    if isinstance(parents, torch.Tensor):
        t = parents.detach().cpu()
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            raise TypeError(f"parents must hold integer indices, got dtype {t.dtype}")
        t = t.long()
    else:
        try:
            values = list(parents)
        except TypeError:
            raise TypeError(f"parents must be a 1-D sequence of ints, got {type(parents).__name__}") from None
        if any(isinstance(v, bool) or not hasattr(v, "__index__") for v in values):
            raise TypeError(f"parents must hold integer indices, got {values!r}")
        t = torch.tensor([int(v) for v in values], dtype=torch.long)
    if t.dim() != 1:
        raise ValueError(f"parents must be 1-D (one parent index per draft node), got shape {tuple(t.shape)}")
    if n is not None and t.numel() != n:
        raise ValueError(f"parents has {t.numel()} entries for {n} draft tokens: one parent per node")
    idx = torch.arange(t.numel())
    bad_low = t < ROOT
    if bad_low.any():
        i = int(idx[bad_low][0])
        raise ValueError(f"parents[{i}] = {int(t[i])}: a parent is {ROOT} (the root, the last committed "
                         "token) or the index of an earlier node")
    bad_order = t >= idx
    if bad_order.any():
        i = int(idx[bad_order][0])
        raise ValueError(f"parents[{i}] = {int(t[i])} does not point to an earlier node: parents must point to "
                         f"earlier indices ({ROOT} = the root), so a parent always comes before its children")
    return t


def chain_parents(n: int) -> torch.Tensor:
    """The parents of a chain of n drafted tokens, ``[-1, 0, 1, ..., n-2]``: a chain is the
    special case of a tree with one child per node."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    return torch.arange(n, dtype=torch.long) - 1


def tree_depths(parents) -> torch.Tensor:
    """Depth of every node (LongTensor [n]): 1 for the root's children, parent's depth + 1 below.

    The depth is how many tokens after the root the node sits, so a node's position id is
    ``past_len + depth`` and its path has ``depth`` tokens.
    """
    p = validate_parents(parents).tolist()
    depth = []
    for par in p:  # parents come first, so their depth is known
        depth.append(1 if par == ROOT else depth[par] + 1)
    return torch.tensor(depth, dtype=torch.long)


def ancestor_matrix(parents) -> torch.Tensor:
    """Bool [n, n]: ``A[i, j]`` is True when node j is node i itself or one of its ancestors.

    Row i is what node i may attend to among the nodes (the tree part of the attention mask).
    Built top-down: a node's row is its parent's row plus itself.
    """
    p = validate_parents(parents).tolist()
    n = len(p)
    a = torch.zeros(n, n, dtype=torch.bool)
    for i, par in enumerate(p):
        if par != ROOT:
            a[i] = a[par]
        a[i, i] = True
    return a


def children_by_slot(parents) -> list:
    """Children of every slot, in node order: entry 0 lists the root's children, entry i + 1
    node i's. Verification walks a node's children in this order."""
    p = validate_parents(parents).tolist()
    kids: list = [[] for _ in range(len(p) + 1)]
    for i, par in enumerate(p):
        kids[par + 1].append(i)
    return kids


def path_to(parents, node: int) -> list:
    """Node indices from the root's child down to ``node`` (the root itself is not a node)."""
    p = validate_parents(parents).tolist()
    if not 0 <= node < len(p):
        raise ValueError(f"node {node} out of range for a tree of {len(p)} nodes")
    path = [node]
    while p[path[-1]] != ROOT:
        path.append(p[path[-1]])
    return path[::-1]


def root_to_leaf_paths(parents) -> list:
    """Every root-to-leaf path as a list of node indices, ordered by leaf index.

    These are the candidate continuations the tree encodes (Medusa's ``retrieve_indices``); a
    chain has one. An empty tree has none.
    """
    p = validate_parents(parents)
    kids = children_by_slot(p)
    return [path_to(p, i) for i in range(p.numel()) if not kids[i + 1]]


# --------------------------------------------------------------------------------------------
# What the target forward needs: visibility (masks.tree_attention_mask) and position ids.
# --------------------------------------------------------------------------------------------

def tree_visibility(parents, past_len: int, device=None) -> torch.Tensor:
    """Bool [n+1, past_len + n + 1]: True where query slot s may attend to key column c.

    Key columns: the ``past_len`` cached positions, then the root, then the n nodes (the order in
    which the forward appends them to the cache). Every slot sees the whole committed prefix and
    the root; node i also sees its ancestors and itself, and nothing else (not its siblings, not
    other branches). For a chain this is the ordinary causal mask.
    """
    if not isinstance(past_len, int) or isinstance(past_len, bool) or past_len < 0:
        raise ValueError(f"past_len must be an int >= 0 (positions already in the cache), got {past_len!r}")
    anc = ancestor_matrix(parents)
    n = anc.shape[0]
    vis = torch.zeros(n + 1, past_len + n + 1, dtype=torch.bool)
    vis[:, : past_len + 1] = True  # prefix and root: seen by everyone
    vis[1:, past_len + 1:] = anc
    return vis if device is None else vis.to(device)


def tree_attention_mask(parents, past_len: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The additive mask [1, 1, n+1, past_len + n + 1] for ``[root] + nodes`` of a candidate tree.

    0 where :func:`tree_visibility` allows attention (every slot sees the prefix and the root,
    node i also its ancestors and itself), ``finfo(dtype).min`` elsewhere: the additive form of
    masks.py, which lists this mask with the others. Use it together with :func:`tree_position_ids`.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (the model's), got {dtype!r}")
    visible = tree_visibility(parents, past_len, device)
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def tree_position_ids(parents, past_len: int, device=None) -> torch.Tensor:
    """Position ids [1, n+1]: the root at ``past_len``, node i at ``past_len + depth(i)``.

    Siblings share a position: each is "the next token" of the same prefix. The default position
    ids (consecutive slots) would place a node as if every earlier slot preceded it, and its
    rotary embedding would no longer match the path read as plain text.
    """
    if not isinstance(past_len, int) or isinstance(past_len, bool) or past_len < 0:
        raise ValueError(f"past_len must be an int >= 0 (positions already in the cache), got {past_len!r}")
    depth = tree_depths(parents)
    pos = torch.cat([torch.zeros(1, dtype=torch.long), depth]) + past_len
    pos = pos[None]
    return pos if device is None else pos.to(device)


def kept_positions(past_len: int, path: Sequence[int]) -> torch.Tensor:
    """Cache positions to keep after verification: the prefix, the root, the accepted path.

    Node i sits at cache position ``past_len + 1 + i``; the path's nodes are kept in path order.
    path: [m] node indices, root side first. Returns a LongTensor [past_len + 1 + m]; feed it to
    ``kv.keep_positions``.
    """
    path = [int(i) for i in path]
    return torch.tensor(list(range(past_len + 1)) + [past_len + 1 + i for i in path], dtype=torch.long)


# --------------------------------------------------------------------------------------------
# Building and trimming trees.
# --------------------------------------------------------------------------------------------

class ChoiceTree(NamedTuple):
    """A tree built from Medusa-style choices.

    parents: LongTensor [n]. ranks: LongTensor [n], the last entry of each node's choice (which
    top-k candidate of its depth the node takes). choices: the choices in node order.
    """

    parents: torch.Tensor
    ranks: torch.Tensor
    choices: list


def tree_from_choices(choices) -> ChoiceTree:
    """Build a tree from paths of top-k indices (Medusa's ``medusa_choices``).

    Each choice is a tuple: ``(0,)`` is the best candidate at depth 1, ``(0, 1)`` the second best
    candidate at depth 2 *under* ``(0,)``, and so on. A choice's parent is the choice without its
    last entry, which must itself be listed (a tree has no dangling branches). Nodes are ordered
    by depth, then lexicographically (as Medusa sorts them), so parents come first.

    A proposer fills node i with the ``ranks[i]``-th candidate of depth ``depth(i)`` (Medusa: of
    head ``depth - 1``; EAGLE: among the children of the node's parent).
    """
    items = []
    for c in choices:
        try:
            t = tuple(int(x) for x in c)
        except TypeError:
            raise ValueError(f"each choice must be a tuple of top-k indices, got {c!r}") from None
        if not t:
            raise ValueError("the empty choice () is the root (the last committed token), not a node")
        if any(x < 0 for x in t):
            raise ValueError(f"top-k indices must be >= 0, got {c!r}")
        items.append(t)
    if len(set(items)) != len(items):
        dup = next(t for t in items if items.count(t) > 1)
        raise ValueError(f"choice {dup} is listed twice")
    ordered = sorted(items, key=lambda t: (len(t), t))
    index = {t: i for i, t in enumerate(ordered)}
    parents = []
    for t in ordered:
        if len(t) == 1:
            parents.append(ROOT)
        elif t[:-1] in index:
            parents.append(index[t[:-1]])
        else:
            raise ValueError(f"choice {t} has no parent: {t[:-1]} is not in the choices")
    return ChoiceTree(torch.tensor(parents, dtype=torch.long),
                      torch.tensor([t[-1] for t in ordered], dtype=torch.long), ordered)


def clip_tree(parents, max_depth: int | None = None, max_nodes: int | None = None):
    """Drop nodes deeper than ``max_depth`` and all nodes after the first ``max_nodes``.

    Returns ``(new_parents [n'], keep [n'])``: ``keep`` (LongTensor, increasing) are the kept
    nodes' old indices, ``new_parents`` their parents re-indexed. Both rules keep every kept node's
    ancestors (ancestors are shallower and earlier), so the result is a tree. The engine clips to
    the token budget and the context window: a node deeper than what can still be emitted could
    never be used.
    """
    p = validate_parents(parents)
    keep = torch.ones(p.numel(), dtype=torch.bool)
    if max_depth is not None:
        if max_depth < 0:
            raise ValueError(f"max_depth must be >= 0, got {max_depth}")
        keep &= tree_depths(p) <= max_depth
    if max_nodes is not None:
        if max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
        keep[max_nodes:] = False
    kept = torch.nonzero(keep).flatten()
    new_index = torch.full((p.numel() + 1,), ROOT, dtype=torch.long)  # by old slot; entry 0: the root
    new_index[kept + 1] = torch.arange(kept.numel())
    new_parents = new_index[p[kept] + 1]
    return new_parents, kept


def tree_to_text(parents, labels=None) -> str:
    """An indented drawing of the tree, one node per line (``labels[i]`` after node i), for notebooks."""
    p = validate_parents(parents)
    kids = children_by_slot(p)
    lines = ["root"]

    def show(slot, indent):
        for i in kids[slot]:
            lines.append("  " * indent + f"└ node {i}" + ("" if labels is None else f": {labels[i]}"))
            show(i + 1, indent + 1)

    show(0, 1)
    return "\n".join(lines)
