"""The data structure behind suffix decoding: frequency-counted suffix trees, cut at a depth.

A suffix tree over a sequence holds every suffix of it, so the path from the root spelled by a
pattern reaches a node exactly when the pattern occurred, and the node's count says how often.
Following the child with the largest count continues the pattern the way the past most often did;
``child.count / node.count`` is that continuation's frequency, an estimate of its probability.

Two simplifications, both those of the SuffixDecoding paper (Oliaro et al., arXiv 2411.04975)
and of its implementation in Arctic Inference (``csrc/suffix_decoding/suffix_tree.cc``):

* **Depth.** Only the first ``max_depth`` tokens of each suffix are stored, so appending a token
  costs O(max_depth) and a match plus its continuation spans at most ``max_depth`` tokens.
* **Several sequences, removable.** One tree holds many sequences (a request's prompt and output,
  or the outputs of many requests), each under its own id, and a sequence can be removed again
  (its counts taken back): this is how the global tree forgets old requests.

Here the tree is a trie, one node per token: simple to read, the same counts as Arctic's
path-compressed tree (a compressed edge is a run of trie nodes that all have one child and the
same count), and fast enough in Python for the course's workloads.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class _Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0  # suffixes (stored up to max_depth) that pass through or end at this node
        self.children: dict = {}  # token id -> _Node


@dataclass
class SuffixMatch:
    """What ``SuffixTree.speculate`` proposes: a chain of draft tokens and how it was found.

    tokens: the drafted ids, in order. probs: each token's estimated probability (the product of
    count ratios along the path from the matched node). score: sum(probs), the expected number
    of draft tokens the target accepts if the estimates were right, used to pick between matches
    and between trees. match_len: how many of the context's last tokens matched.
    """

    tokens: list = field(default_factory=list)
    probs: list = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixTree:
    """Counts of every suffix (up to ``max_depth`` tokens) of the sequences appended to it."""

    def __init__(self, max_depth: int = 24):
        if not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        self.max_depth = max_depth
        self.root = _Node()
        self._seqs: dict = {}  # seq id -> list of its tokens
        self._open: dict = {}  # seq id -> deque of the nodes where its latest suffixes end

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        """How many tokens the tree holds (the root's count)."""
        return self.root.count

    def append(self, seq_id, token: int) -> None:
        """Add one token to sequence ``seq_id`` (created if new): every suffix that ends at it,
        of length 1..max_depth, gains one count along its path."""
        seq = self._seqs.setdefault(seq_id, [])
        open_nodes = self._open.setdefault(seq_id, deque())
        open_nodes.append(self.root)  # the suffix that starts at this token
        self.root.count += 1
        if len(open_nodes) > self.max_depth:
            open_nodes.popleft()  # that suffix is already max_depth long: it stops growing
        token = int(token)
        seq.append(token)
        for i, node in enumerate(open_nodes):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            open_nodes[i] = child

    def extend(self, seq_id, tokens) -> None:
        for t in tokens:
            self.append(seq_id, t)

    def remove(self, seq_id) -> None:
        """Take sequence ``seq_id`` back out: every count it added is subtracted, and nodes left
        with no count disappear."""
        seq = self._seqs.pop(seq_id)
        self._open.pop(seq_id)
        for start in range(len(seq)):
            self.root.count -= 1
            node = self.root
            for token in seq[start: start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]  # nothing else passes here: drop the whole branch
                    break
                node = child

    def _find(self, pattern) -> _Node | None:
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1) -> SuffixMatch:
        """The best chain continuing ``context`` (a list of ids, its last tokens matter).

        For each match length m = 1, 2, ... (until the context's last m tokens no longer occur,
        at most len(context) - 1): start at the node the pattern reaches, follow the most
        frequent child while the path's estimated probability stays >= ``min_token_prob``, for
        at most min(max_spec_tokens, floor(max_spec_factor * m + max_spec_offset)) tokens: a
        longer match earns a longer draft. The draft with the highest score wins (ties: the
        longer match).
        """
        best = SuffixMatch()
        context = list(context)[-self.max_depth:]
        for m in range(1, len(context)):
            node = self._find(context[len(context) - m:])
            if node is None:
                break  # a longer pattern cannot occur if this one does not
            budget = max(0, min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6)))
            draft = SuffixMatch(match_len=m)
            prob = 1.0
            while len(draft.tokens) < budget and node.children:
                # The most frequent continuation; among equal counts the smallest id, so that a
                # draft does not depend on the order tokens arrived in.
                token, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
                prob *= child.count / node.count
                if prob < min_token_prob:
                    break
                draft.tokens.append(token)
                draft.probs.append(prob)
                draft.score += prob
                node = child
            if draft.score >= best.score:
                best = draft
        return best


class SuffixCache:
    """Suffix decoding's two kinds of tree: one per active request over its own prompt and output,
    and one global tree over the outputs of up to ``max_cached_requests`` requests.

    A request's output enters the global tree as it is generated (other requests running at the
    same time can already draft from it) and stays after the request stops, until it is evicted,
    oldest first, to make room. ``max_cached_requests=0`` turns the global tree off; -1 keeps
    every request. The names follow Arctic Inference's ``SuffixDecodingCache``
    (``arctic_inference/suffix_decoding/cache.py``), which vLLM's ``suffix`` method drives.

    A cache is shared on purpose: copying a proposer for another row of a batch (``fork``) must
    not copy the history every request learns from, so ``deepcopy`` returns the cache itself.
    """

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000):
        if not isinstance(max_cached_requests, int) or max_cached_requests < -1:
            raise ValueError(f"max_cached_requests must be an int >= -1 (-1: no limit), got {max_cached_requests!r}")
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.global_tree = SuffixTree(max_tree_depth)
        self.local_trees: dict = {}  # active request id -> SuffixTree over its prompt and output
        self.cached: dict = {}  # request id -> None, in insertion order (FIFO eviction)
        self._next_id = 0

    def __deepcopy__(self, memo):
        return self

    def new_request_id(self) -> int:
        self._next_id += 1
        return self._next_id

    @property
    def active_requests(self):
        return self.local_trees.keys()

    @property
    def cached_requests(self):
        return self.cached.keys()

    def start_request(self, req_id, prompt) -> None:
        if req_id in self.local_trees:
            raise ValueError(f"request {req_id!r} is already active")
        tree = self.local_trees[req_id] = SuffixTree(self.max_tree_depth)
        tree.extend(0, prompt)
        if self.max_cached_requests != 0:
            if req_id in self.cached:
                self.evict(req_id)
            self.cached[req_id] = None
            while self.max_cached_requests > 0 and len(self.cached) > self.max_cached_requests:
                self.evict(next(iter(self.cached)))  # the oldest; never the one just added

    def add_response(self, req_id, tokens) -> None:
        """Tokens the request just committed: into its own tree and, while it is cached, the global one."""
        if req_id not in self.local_trees:
            raise ValueError(f"request {req_id!r} is not active")
        self.local_trees[req_id].extend(0, tokens)
        if req_id in self.cached:
            self.global_tree.extend(req_id, tokens)

    def stop_request(self, req_id) -> None:
        """The request is done: its prompt tree goes, its output stays in the global tree."""
        if req_id not in self.local_trees:
            raise ValueError(f"request {req_id!r} is not active")
        del self.local_trees[req_id]

    def evict(self, req_id) -> None:
        del self.cached[req_id]
        if req_id in self.global_tree:
            self.global_tree.remove(req_id)

    def speculate(self, req_id, context, max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1) -> SuffixMatch:
        """The better (by score) of the request's own tree's draft and the global tree's."""
        if req_id not in self.local_trees:
            raise ValueError(f"request {req_id!r} is not active")
        args = (context, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob)
        own = self.local_trees[req_id].speculate(*args)
        shared = self.global_tree.speculate(*args)
        return own if own.score >= shared.score else shared
