"""Lab 5 — tree attention. Fill in the four functions below (torch only).

A tree draft offers several candidate continuations at once. It is stored as ``parents``, a
LongTensor [n] (a list of ints works too): ``parents[i]`` is the index of node i's parent, or -1
when node i hangs directly under the **root**, the last committed token. A parent always comes
before its children (``parents[i] < i``); a chain of n tokens is ``[-1, 0, 1, ..., n-2]``.

The target scores the whole tree in ONE forward: it reads ``[root] + the n nodes`` after the
``past_len`` tokens already in its KV cache. Call position s of that input the **slot**: slot 0
is the root, slot i + 1 is node i. Two things make this equal to running every root-to-node path
as its own sequence:

* the attention mask: each slot sees the cached prefix, the root, its own ancestors and itself,
  and nothing else (not its siblings, not other branches);
* the position ids: a node sits at ``past_len + depth``, where the root's children have depth 1
  (siblings share a position: each is "the next token" after the same prefix).

Row s of the target's logits is its prediction for the token after slot s, so node i is checked
against the row of its parent's slot, ``parents[i] + 1``.
"""
from __future__ import annotations

import torch


def tree_depths(parents):
    """Depth of every node as a LongTensor [n]: 1 for the children of the root (parent -1), the
    parent's depth + 1 for the others. An empty tree gives an empty tensor.

    Raise ValueError if some ``parents[i]`` is neither -1 nor the index of an earlier node
    (0 <= parents[i] < i): such a list is not a tree (a node would be its own ancestor).
    """
    raise NotImplementedError("tree_depths")


def tree_attention_mask(parents, past_len, dtype=torch.float32):
    """The additive attention mask for one forward over ``[root] + nodes``.

    Returns a tensor of shape [1, 1, n + 1, past_len + n + 1] and the given floating ``dtype``:
    row s is query slot s, column c a key: columns 0 .. past_len - 1 are the cached prefix,
    column past_len is the root, column past_len + 1 + j is node j. The entry is 0.0 where
    the query may attend to the key and ``torch.finfo(dtype).min`` where it may not:

    * every slot sees the whole prefix and the root;
    * node i (slot i + 1) also sees node j exactly when j is i itself or one of i's ancestors.

    (transformers passes a 4D mask through to attention unchanged; the model adds it to the
    attention scores.) Raise ValueError for malformed parents, as in tree_depths.
    """
    raise NotImplementedError("tree_attention_mask")


def tree_position_ids(parents, past_len):
    """Position ids for ``[root] + nodes``: a LongTensor of shape [1, n + 1] holding past_len for
    the root and past_len + depth(i) for node i. Raise ValueError for malformed parents."""
    raise NotImplementedError("tree_position_ids")


def tree_greedy_verify(target_logits, parents, draft_tokens):
    """Greedy verification of a tree draft.

    target_logits: [n + 1, V], row s the target's logits after slot s. draft_tokens: LongTensor
    [n], the token of each node. A node is *correct* when its token equals the argmax of its
    parent's row (``target_logits[parents[i] + 1]``). Accept the longest path from the root whose
    nodes are all correct; if several are equally long take the one ending at the lowest node
    index. Return ``(accepted, emitted)``:

    * accepted: the node indices of that path, root side first (empty if no child of the root
      is correct);
    * emitted: the tokens the step commits: the accepted nodes' tokens, then the target's argmax
      after the last accepted node (after the root when nothing was accepted), so
      ``len(emitted) == len(accepted) + 1``.

    Lists or 1-D LongTensors are both fine as return values.
    """
    raise NotImplementedError("tree_greedy_verify")
