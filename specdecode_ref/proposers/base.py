"""The proposer interface: what every drafter (n-gram, draft model, early exit, Medusa, EAGLE) implements.

One engine step (see engine.py): ``propose`` returns a :class:`Draft`; the target scores the last
committed token plus the draft in one forward; verification keeps a prefix; ``on_verified`` tells
the proposer what was committed so it can roll back its own state (a draft model's KV cache,
EAGLE's feature cache). Proposers that read the target's hidden states (Medusa, EAGLE, early-exit
adapters) set ``needs_hidden_states``; the engine then hands them the target's hidden states for
the prompt in ``begin`` and for every committed position in ``on_verified``.
"""
from __future__ import annotations

import copy
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from ..sampling import SamplingParams

#: How a drafter picks its tokens when the request samples (temperature > 0). "sample": draw each
#: token from q, the drafter's own distribution processed like the target's, and report q, so
#: rejection sampling accepts with probability sum_x min(p, q) = 1 - TV(p, q). "greedy": propose the
#: drafter's argmax a* and report nothing (q one-hot on a*), accepted with probability p(a*), as
#: vLLM's drafters do. Both are lossless; which accepts more is analysis.acceptance_with_q versus
#: analysis.acceptance_one_hot. At temperature 0 both are the same argmax drafting.
DRAFT_SAMPLING = ("sample", "greedy")


def check_k(k) -> int:
    """``k``, the number of tokens drafted per step, checked: an int >= 1."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k (tokens drafted per step) must be an int >= 1, got {k!r}")
    return k


def resolve_draft_sampling(mode, default: str = "sample", can_sample: bool = True,
                           who: str = "this proposer") -> str:
    """The drafting mode a proposer uses: ``mode`` ("sample", "greedy", or None for ``default``),
    checked. A proposer whose candidates are deterministic (copied n-grams, top-k tree children)
    has no q to draw from: ``can_sample=False`` lets it accept only "greedy"."""
    mode = default if mode is None else mode
    if mode not in DRAFT_SAMPLING:
        raise ValueError(f"draft_sampling must be one of {DRAFT_SAMPLING} (or None for the default), got {mode!r}")
    if mode == "sample" and not can_sample:
        raise ValueError(f"{who} proposes deterministic candidates (q one-hot on each of them): "
                         "draft_sampling must be 'greedy'")
    return mode


@dataclass
class Draft:
    """Up to k drafted tokens, a chain or a tree.

    tokens: LongTensor [n], n <= k (n may be 0: nothing to propose, the step decodes one token plainly).
    probs: FloatTensor [n, V], the proposer's distribution q at each drafted position, processed
        with the request's SamplingParams; None for a deterministic proposer (q one-hot). For a
        tree, row i is the distribution node i was drawn from (siblings drawn independently).
    parents: LongTensor [n] of parent indices for a tree draft (``trees.ROOT`` = -1: the last
        committed token); None for a chain, where token i's parent is i - 1.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    parents: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @staticmethod
    def empty(device=None) -> "Draft":
        return Draft(torch.empty(0, dtype=torch.long, device=device))


@dataclass
class DecodeState:
    """What a proposer may read about the request being decoded (owned by the engine)."""

    target: torch.nn.Module
    sampling: SamplingParams
    generator: torch.Generator | None
    prompt_len: int
    token_list: list = field(default_factory=list)  # committed ids: prompt + generated
    prompt_hidden_states: tuple | None = None  # per layer [prompt_len, H] (needs_hidden_states only)
    target_cache: object = None  # the target's KV cache (read-only for all but self-speculative drafts)

    @property
    def num_tokens(self) -> int:
        return len(self.token_list)

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def tokens(self) -> torch.Tensor:
        """Committed ids, a LongTensor [num_tokens] on the target's device."""
        return torch.tensor(self.token_list, dtype=torch.long, device=self.device)


@dataclass
class StepOutcome:
    """What one verification step committed."""

    draft: Draft
    num_accepted: int
    emitted: list  # [num_accepted + 1] ids appended this step: accepted drafts, one target token; EOS may cut it
    hidden_states: tuple | None = None  # per layer [num_accepted + 1, H]: positions last, d1..d_acc
    accepted_nodes: list | None = None  # tree drafts: [num_accepted] accepted node indices, root side first


class Proposer(ABC):
    """Base class of all drafters. Subclasses set ``k`` and implement ``propose``.

    Everything else the engine relies on is declared here, with a default that suits a proposer
    reading only token ids (n-gram); a drafter overrides what it needs. A wrapper
    (:class:`ProposerWrapper`: adaptive K, the acceptance probe) forwards every one of them, and
    ``k``, to the proposer it wraps:

    * ``check_compatible(target)``: refuse a target it cannot draft for, before anything runs;
    * ``begin(state)`` / ``on_verified(state, outcome)``: start a request; roll its own state
      back after each step;
    * ``needs_hidden_states``: the engine collects the target's hidden states for both;
    * ``scores_draft`` with ``score(state, ids)``: the proposer runs the verification forward
      itself (early exit: the draft already wrote the first layers' keys and values).

    * ``draft_sampling``: "greedy" (deterministic candidates, q one-hot) or "sample" (tokens
      drawn from the drafter's q, returned in ``Draft.probs``) when the request samples; see
      ``DRAFT_SAMPLING``. The engine does not read it (``Draft.probs`` says what q was); it
      tells a measurement which regime a drafter ran in.

    Drafting a tree needs no declaration: a proposer returns a Draft with ``parents``.
    """

    name = "proposer"
    draft_sampling = "greedy"  # model-based chain drafters default to "sample" (their constructors)
    needs_hidden_states = False  # True: receive the target's hidden states in begin and on_verified
    scores_draft = False  # True: the engine calls score() instead of its own verification forward
    drafts_nothing = False  # True: every path decodes plainly, without asking it (StandAside)

    def __init__(self, k: int):
        self.k = check_k(k)

    def check_compatible(self, target) -> None:
        """Raise a clear error when this proposer cannot draft for ``target`` (e.g. vocabulary)."""

    def begin(self, state: DecodeState) -> None:
        """A new request starts (prompt in ``state.token_list``): reset or prefill own state."""

    @abstractmethod
    def propose(self, state: DecodeState) -> Draft:
        """Draft up to ``self.k`` tokens continuing ``state.token_list``: a Draft with tokens [n],
        probs [n, V] or None, parents [n] (a tree) or None (a chain)."""

    def score(self, state: DecodeState, ids: list) -> torch.Tensor:
        """The verification forward, run by the proposer (only when ``scores_draft``).

        ids: [n+1] token ids, the last committed token then a chain draft of n tokens. Must return
        the target's logits [n+1, V], exactly those of a plain target forward, and leave the target
        cache (``state.target_cache``) holding these n+1 positions in every layer, as that forward
        would: the engine then crops it to what verification kept.
        """
        raise NotImplementedError(f"{type(self).__name__} sets scores_draft but does not implement score()")

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        """Roll back own state to the committed tokens (``state.token_list`` is already updated)."""

    def batch_proposer(self) -> "BatchProposer":
        """A BatchProposer drafting for every row of a batch (generate_batch, see proposers/batch.py).
        The default drives one copy of this proposer per row; drafters that can share a forward
        across rows (the draft model) override it."""
        return PerRowBatchProposer(self)

    def __repr__(self) -> str:
        return with_sizing(self, f"{type(self).__name__}(k={self.k})")


def with_sizing(proposer, text: str) -> str:
    """A proposer's repr ``text`` ("Name(...)") with the size ``load_proposer`` chose for it on this
    machine, and why, when it chose one (``proposer.sizing``, a ``sizing.DraftSize``)."""
    choice = getattr(proposer, "sizing", None)
    return text if choice is None else f"{text[:-1]}; {choice.describe()})"


class StandAside(Proposer):
    """What ``load_proposer`` returns when no draft size of a drafter is predicted at least
    ``sizing.MIN_GAIN`` faster than plain decoding on this machine: it drafts nothing (``generate``, ``generate_batch`` and the
    scheduler decode plainly when given it), and says why (``sizing``). The drafter it stands in
    for is built and kept (``drafter``): pass an explicit k to ``load_proposer`` to draft with it."""

    drafts_nothing = True

    def __init__(self, drafter: Proposer, sizing=None):
        super().__init__(1)
        self.drafter, self.sizing = drafter, sizing

    def propose(self, state: DecodeState) -> Draft:
        return Draft.empty(state.device)

    def __repr__(self) -> str:
        return with_sizing(self, f"StandAside({type(self.drafter).__name__})")


class ProposerWrapper(Proposer):
    """A proposer that wraps another and changes part of what it does (adaptive.AdaptiveK picks k
    each step; measure.sampling_regime.AcceptanceProbe records acceptance).

    Every capability declared on :class:`Proposer` is forwarded to ``self.proposer``, read when it
    is asked for (never copied at construction), and so is ``k``, for reading and for writing:
    setting ``wrapper.k`` sets the wrapped proposer's k, so a chain of wrappers passes the k one
    of them chooses down to the drafter. A subclass overrides only what it changes and calls
    ``super()`` for the rest. A wrapper that dropped a capability would still run, wrongly: early
    exit without its own scorer verifies on a cache its draft already wrote to.

    ``name`` is the wrapped proposer's unless a subclass names itself. ``batch_proposer`` is not
    forwarded: see its docstring.
    """

    def __init__(self, proposer: Proposer):
        if not isinstance(proposer, Proposer):
            raise TypeError(f"proposer must be a specdecode_ref.proposers.Proposer, got {type(proposer).__name__}")
        self.proposer = proposer
        self.name = proposer.name

    @property
    def drafts_nothing(self) -> bool:
        """A wrapper around a drafter that stands aside drafts nothing either."""
        return self.proposer.drafts_nothing

    @property
    def k(self) -> int:
        return self.proposer.k

    @k.setter
    def k(self, value: int) -> None:
        self.proposer.k = check_k(value)

    @property
    def needs_hidden_states(self) -> bool:
        return self.proposer.needs_hidden_states

    @property
    def scores_draft(self) -> bool:
        return self.proposer.scores_draft

    @property
    def draft_sampling(self) -> str:
        return self.proposer.draft_sampling

    def check_compatible(self, target) -> None:
        self.proposer.check_compatible(target)

    def begin(self, state: DecodeState) -> None:
        self.proposer.begin(state)

    def propose(self, state: DecodeState) -> Draft:
        return self.proposer.propose(state)

    def score(self, state: DecodeState, ids: list) -> torch.Tensor:
        return self.proposer.score(state, ids)

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        self.proposer.on_verified(state, outcome)

    def batch_proposer(self) -> "BatchProposer":
        """One fork of the whole wrapper per row (:class:`PerRowBatchProposer`), not the wrapped
        proposer's batched form: that would draft one k for every row and call none of the
        wrapper's hooks, so no row would adapt its k or record its acceptance. Each row keeps its
        own wrapper state; the weights are shared (:func:`fork`), only the forwards run per row."""
        return PerRowBatchProposer(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.proposer!r})"


# ---- drafting for a whole batch (generate_batch); proposers/batch.py re-exports these ----------

class BatchProposer(ABC):
    """Drafts for the active rows of a batch. Row lists are in the batch's current order.

    ``needs_hidden_states``: the engine hands each row its own hidden states, as ``generate``
    does for one request (``DecodeState.prompt_hidden_states`` in begin / add_rows,
    ``StepOutcome.hidden_states`` in on_verified).
    """

    needs_hidden_states = False

    def __init__(self, proposer: Proposer):
        self.proposer = proposer
        self.k = proposer.k

    @abstractmethod
    def begin(self, states: list) -> None:
        """All rows start (prompts in ``states[b].token_list``, first token already committed)."""

    @abstractmethod
    def add_rows(self, states: list) -> None:
        """Rows join after the current ones (a server admits requests while others decode; a
        preempted request comes back), their first token committed as in ``begin``."""

    @abstractmethod
    def propose(self, states: list) -> list:
        """One Draft (chain of 0..k tokens) per row."""

    @abstractmethod
    def on_verified(self, states: list, outcomes: list) -> None:
        """Roll back each row's own state (``states[b].token_list`` already updated)."""

    @abstractmethod
    def keep_rows(self, rows: list) -> None:
        """Only the rows ``rows`` (indices into the current rows) stay in the batch."""

    def row_proposer(self, row: int) -> Proposer:
        """The proposer that drafted for ``row`` (its k bounds that row's draft): the one proposer
        when all rows draft together."""
        return self.proposer

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.proposer!r})"


def shared_weights(obj) -> dict:
    """A deepcopy memo that maps every torch Module and Parameter reachable from ``obj`` to itself.

    The walk follows instance attributes, containers and bound methods, so it reaches the draft
    model of a proposer nested in any number of wrappers. It does not enter Modules (a shared
    Module shares everything it holds) nor plain tensors. Plain tensors outside Modules are left
    to deepcopy on purpose: they are per-request state (a controller's counts, a cached feature)
    that a proposer may write in place, and two rows must not write into one tensor.
    """
    memo, seen, stack = {}, set(), [obj]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, (torch.nn.Module, torch.nn.Parameter)):
            memo[id(x)] = x
        elif isinstance(x, torch.Tensor) or isinstance(x, type):
            continue
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
        elif isinstance(x, types.MethodType):
            stack.append(x.__self__)
        elif hasattr(x, "__dict__") and not isinstance(x, (types.FunctionType, types.ModuleType)):
            stack.extend(vars(x).values())
    return memo


def fork(proposer: Proposer) -> Proposer:
    """An independent copy for another request: its own mutable state (a wrapper's adaptive k and
    statistics included), the same Modules and Parameters (weights are never copied, however
    deep the wrapped proposer holds them)."""
    return copy.deepcopy(proposer, shared_weights(proposer))


def refuse_own_scorer(proposer: Proposer) -> None:
    """A proposer that runs the verification forward itself (``scores_draft``: early exit reuses
    the draft's keys in ONE request's cache) cannot be driven per row of a shared batch cache."""
    if proposer.scores_draft:
        raise NotImplementedError(
            f"{proposer!r} runs the verification forward itself in one request's cache; in a batch "
            "or a server it drafts through its own batch_proposer() (early exit's draws all rows "
            "in one forward), which a wrapper around it cannot use. Decode it with generate(), "
            "or pass the early-exit proposer unwrapped.")


class PerRowBatchProposer(BatchProposer):
    """One copy of ``proposer`` per row, each driven exactly as ``generate`` drives it (with
    the row's own hidden states when it reads them: Medusa, Hydra, EAGLE)."""

    def __init__(self, proposer: Proposer):
        refuse_own_scorer(proposer)
        super().__init__(proposer)
        self.rows: list = []

    @property
    def needs_hidden_states(self) -> bool:
        return self.proposer.needs_hidden_states

    def begin(self, states: list) -> None:
        self.rows = []
        self.add_rows(states)

    def add_rows(self, states: list) -> None:
        for s in states:
            p = fork(self.proposer)
            p.begin(s)
            self.rows.append(p)

    def propose(self, states: list) -> list:
        return [p.propose(s) for p, s in zip(self.rows, states)]

    def on_verified(self, states: list, outcomes: list) -> None:
        for p, s, o in zip(self.rows, states, outcomes):
            p.on_verified(s, o)

    def keep_rows(self, rows: list) -> None:
        self.rows = [self.rows[r] for r in rows]

    def row_proposer(self, row: int) -> Proposer:
        return self.rows[row]  # an adaptive copy may have moved its own k


def step_hidden_states(proposer) -> bool:
    """Whether the next verification step must return hidden states. A proposer may answer per step
    with ``needs_step_hidden_states`` (a router that chose plain decoding or prompt lookup needs
    none); otherwise ``needs_hidden_states`` holds for the whole request."""
    return bool(getattr(proposer, "needs_step_hidden_states", proposer.needs_hidden_states))
