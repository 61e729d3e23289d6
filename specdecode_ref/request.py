"""One request's life, the same on every decoding path.

``generate`` (engine.py, one request), ``generate_batch`` (batch.py, many rows in one forward) and
the serving scheduler (serving/scheduler.py, requests that join, wait and are preempted) differ
in how they *score* drafts: one cache or a padded batch cache, one request or many. What happens
to a request around that forward is the same everywhere, and lives here, once:

* the request starts (:meth:`Request.start`): its prompt checked, its own torch.Generator seeded
  (never reseeded per draw, so a request draws the same tokens alone or in any batch), its
  ``DecodeState``;
* the prefill's token is drawn from the target alone (:meth:`Request.commit_first`);
* a draft is checked and cut to what the step could still emit (:meth:`Request.take_draft`:
  max_new_tokens and the context window, one token of every step being the target's);
* verification's :class:`Verdict` is committed (:meth:`Request.commit`): tokens up to the first
  EOS and the token budget, each token's kind (accepted draft, recovered, bonus, plain target
  token), SpecStats, and the step's :class:`StepOutcome` for the proposer to roll back with;
* the result (:meth:`Request.result`).

Counterparts: vLLM ``vllm/v1/request.py`` (``Request``: token ids, spec token ids, status) and the
commit in ``vllm/v1/core/sched/scheduler.py`` (``update_from_output``).
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field

import torch

from . import trees
from .metrics import SpecStats
from .proposers.base import DecodeState, Draft, Proposer, StepOutcome
from .sampling import GREEDY, SamplingParams, next_token

# How each new token came to be (measure/viz.py colours them).
TARGET, ACCEPTED, RECOVERED, BONUS = "target", "accepted", "recovered", "bonus"


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # 1-D LongTensor of the new tokens only
    stats: SpecStats
    token_kinds: list = field(default_factory=list)  # one of TARGET/ACCEPTED/RECOVERED/BONUS per token
    finish_reason: str = "length"  # "length" or "eos"

    def text(self, tokenizer, skip_special_tokens: bool = True) -> str:
        return tokenizer.decode(self.tokens.tolist(), skip_special_tokens=skip_special_tokens)


# ---- input checks shared by every path ---------------------------------------------------------

def eos_token_ids(model, eos_token_id=None) -> list:
    """The ids that end generation: ``eos_token_id`` if given (int or list), else the model's
    generation config, else its config; in that order, without duplicates."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return list(dict.fromkeys(int(t) for t in eos_token_id))


def context_window(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def as_int(value) -> int | None:
    """``value`` as an int if it is one (numpy ints too), else None: a bool, a float (even 2.0) or a
    string is not, so that nothing is silently rounded or parsed."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_positive_int(value, name: str) -> int:
    """``value`` as an int if it is a whole number >= 1 (numpy ints too; a bool or a float is not),
    else a ValueError naming ``name``."""
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return number


def check_seed(value, name: str = "seed") -> int:
    """``value`` as an int seed (None means 0); anything else a ValueError naming ``name``."""
    seed = 0 if value is None else as_int(value)
    if seed is None:
        raise ValueError(f"{name} must be an int, got {value!r}")
    return seed


def as_prompt(input_ids) -> torch.Tensor:
    """The checks a prompt needs without a model: 1-D (or [1, L]), not empty, integer token ids
    (a list of floats is refused, not truncated). Returns a 1-D LongTensor."""
    if not isinstance(input_ids, torch.Tensor):
        try:
            input_ids = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"input_ids must be a 1-D tensor or list of integer token ids, "
                            f"got {type(input_ids).__name__}") from None
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be 1-D (or [1, L]), got a batch of {input_ids.shape[0]} rows: generate() "
                             "decodes one request at a time (generate_batch takes a list of prompts)")
        input_ids = input_ids[0]
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D (or [1, L]), got shape {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError("the prompt is empty: generation needs at least one input token (got an empty prompt)")
    if input_ids.dtype in (torch.uint8, torch.int8):
        raise ValueError(f"input_ids are {input_ids.dtype}, too narrow for token ids (a vocabulary of thousands "
                         "wraps around in it before the ids reach here); pass int64 (torch.long) token ids")
    if input_ids.dtype not in (torch.long, torch.int, torch.int32, torch.int16):
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    return input_ids.long()


def validate_prompt(model, input_ids, max_new_tokens) -> torch.Tensor:
    """A prompt checked against ``model``: ids inside its vocabulary, prompt + max_new_tokens inside
    its context window (nothing is truncated). Returns a 1-D LongTensor."""
    input_ids = as_prompt(input_ids)
    check_positive_int(max_new_tokens, "max_new_tokens")
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab}); got min {int(input_ids.min())}, "
                         f"max {int(input_ids.max())}")
    window = context_window(model)
    if window is not None and input_ids.numel() + max_new_tokens > window:
        raise ValueError(
            f"prompt of {input_ids.numel()} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
            f"context window of {window} tokens; shorten the prompt or ask for fewer tokens")
    return input_ids


def check_sampling_and_proposer(model, sampling, proposer) -> SamplingParams:
    """Clear errors for the settings a request shares with a batch; returns the SamplingParams."""
    sampling = GREEDY if sampling is None else sampling
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    sampling.check()  # again: fields changed after construction would otherwise fail deep inside torch
    if proposer is not None and not isinstance(proposer, Proposer):
        raise TypeError(f"proposer must be a specdecode_ref.proposers.Proposer, got {type(proposer).__name__}")
    if proposer is not None:
        proposer.check_compatible(model)
    return sampling


def drafting(proposer: Proposer | None) -> Proposer | None:
    """The proposer a path drafts with: None (plain decoding) also for a proposer that declares it
    drafts nothing (``load_proposer``'s ``StandAside``, where no draft is predicted to pay),
    so that standing aside costs exactly what plain decoding costs."""
    return None if proposer is None or proposer.drafts_nothing else proposer


def check_draft(proposer: Proposer, draft: Draft) -> None:
    """A proposer's draft keeps its promises: at most k tokens, and q (if any) for each of them."""
    if len(draft) > proposer.k:
        raise ValueError(f"{proposer!r} drafted {len(draft)} tokens, more than its k={proposer.k}")
    if draft.probs is not None and draft.probs.shape[0] != len(draft):
        raise ValueError(f"draft probs cover {draft.probs.shape[0]} positions for {len(draft)} tokens")


def sync(device) -> None:
    """Wait for the GPU's queued kernels, so that a wall-clock reading covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the step rule -----------------------------------------------------------------------------

def clip_draft(draft: Draft, limit: int) -> Draft:
    """``draft`` without the tokens that could not be emitted: a chain cut to ``limit`` tokens, a
    tree without the nodes deeper than ``limit``."""
    limit = max(int(limit), 0)
    if draft.is_tree:
        parents = trees.validate_parents(draft.parents, len(draft))
        new_parents, keep = trees.clip_tree(parents, max_depth=limit)
        if keep.numel() == len(draft):
            return Draft(draft.tokens, draft.probs, parents)
        probs = None if draft.probs is None else draft.probs[keep.to(draft.probs.device)]
        return Draft(draft.tokens[keep.to(draft.tokens.device)], probs, new_parents)
    if len(draft) <= limit:
        return draft
    return Draft(draft.tokens[:limit], None if draft.probs is None else draft.probs[:limit])


@dataclass
class Verdict:
    """What verification decided in one step, before EOS and max_new_tokens cut it."""

    emitted: list  # the accepted drafted tokens, then one token from the target
    num_accepted: int
    ends_at_leaf: bool  # nothing drafted was left to reject (whole chain, or a path to a leaf)
    hidden: tuple | None = None  # per layer [num_accepted + 1, H]: the target at the root and the accepted tokens
    accepted_nodes: list | None = None  # tree drafts: the accepted path, root side first

    @classmethod
    def of_chain(cls, draft: Draft, emitted: list, num_accepted: int, hidden=None) -> "Verdict":
        return cls(list(emitted), int(num_accepted), int(num_accepted) == len(draft), hidden,
                   [] if draft.is_tree else None)


def step_kinds(num_drafted: int, num_accepted: int, ends_at_leaf: bool) -> list:
    """The kind of each token a step emits: the accepted drafts, then the step's own token: plain
    decoding (nothing drafted), a bonus (nothing was left to reject) or a recovered token."""
    last = TARGET if num_drafted == 0 else (BONUS if ends_at_leaf else RECOVERED)
    return [ACCEPTED] * num_accepted + [last]


class Request:
    """The bookkeeping of one request: the new tokens and how each came to be, EOS and
    max_new_tokens, SpecStats, and what its proposer (if it holds one) is told after every step.

    ``proposer``: the drafter ``commit`` tells about each step (``generate``); None where the
    caller drives a drafter for many requests itself (``generate_batch``'s batch proposer, the
    scheduler's per-request copies), which it tells with the StepOutcome ``commit`` returns.
    """

    def __init__(self, state: DecodeState, proposer: Proposer | None, max_new_tokens: int, eos: set, window):
        self.state, self.proposer = state, proposer
        self.max_new_tokens, self.eos, self.window = max_new_tokens, eos, window
        self.tokens: list = []
        self.kinds: list = []
        self.finish = "length"
        self.stats = SpecStats()

    @classmethod
    def start(cls, model, prompt: torch.Tensor, sampling: SamplingParams, seed: int, max_new_tokens: int,
              eos: set, proposer: Proposer | None = None) -> "Request":
        """A request for a checked 1-D prompt: its DecodeState and, when sampling, its own
        generator seeded with ``seed``."""
        device = next(model.parameters()).device
        generator = None
        if not sampling.is_greedy:  # one generator per request, never reseeded per draw
            generator = torch.Generator(device=device)
            generator.manual_seed(seed)
        state = DecodeState(target=model, sampling=sampling, generator=generator, prompt_len=prompt.numel(),
                            token_list=prompt.tolist())
        return cls(state, proposer, max_new_tokens, eos, context_window(model))

    @property
    def done(self) -> bool:
        return self.finish == "eos" or len(self.tokens) >= self.max_new_tokens

    def draft_limit(self) -> int:
        """The most drafted tokens (tree depth) that could still be emitted: one token of the
        step is the target's, and neither max_new_tokens nor the context window may be passed."""
        limit = self.max_new_tokens - len(self.tokens) - 1
        if self.window is not None:
            limit = min(limit, self.window - len(self.state.token_list))
        return limit

    def timed(self, fn, *args):
        """Call a proposer hook, charging its time to the draft."""
        t0 = time.perf_counter()
        out = fn(*args)
        self.stats.draft_time_s += time.perf_counter() - t0
        return out

    def take_draft(self, proposer: Proposer, draft: Draft, limit: int | None = None) -> Draft:
        """``proposer``'s draft, checked, and cut to what this step could still emit (and to
        ``limit`` tokens, e.g. a serving policy's K, when given)."""
        check_draft(proposer, draft)
        cap = self.draft_limit() if limit is None else min(limit, self.draft_limit())
        return clip_draft(draft, cap)

    def append(self, tokens: list, kinds: list) -> list:
        """Commit ``tokens``: at most max_new_tokens in all, and nothing after the first EOS
        (which is kept). Returns what was committed."""
        tokens = tokens[: self.max_new_tokens - len(self.tokens)]
        for i, tok in enumerate(tokens):
            if tok in self.eos:
                tokens = tokens[: i + 1]
                self.finish = "eos"
                break
        self.tokens.extend(tokens)
        self.kinds.extend(kinds[: len(tokens)])
        self.state.token_list.extend(tokens)
        return tokens

    def draw(self, logits: torch.Tensor) -> int:
        """The target's next token from its logits [V], with the request's sampling and generator."""
        return int(next_token(logits, self.state.sampling, self.state.generator))

    def commit_first(self, logits: torch.Tensor) -> list:
        """The prefill's token: drawn from the target's logits [V] at the prompt's last position (the
        same draw on every path). Returns what was committed."""
        return self.append([self.draw(logits)], [TARGET])

    def commit(self, draft: Draft, verdict: Verdict) -> StepOutcome:
        """Commit one verification step: its tokens (up to EOS and max_new_tokens) with their
        kinds, the step in SpecStats, and the outcome to the request's own proposer, if any.
        Returns that StepOutcome (``emitted``: what was committed)."""
        kinds = step_kinds(len(draft), verdict.num_accepted, verdict.ends_at_leaf)
        emitted = self.append(verdict.emitted, kinds)
        self.stats.record_step(len(draft), verdict.num_accepted, len(emitted))
        outcome = StepOutcome(draft, verdict.num_accepted, emitted, verdict.hidden, verdict.accepted_nodes)
        if self.proposer is not None:
            self.timed(self.proposer.on_verified, self.state, outcome)
        return outcome

    def result(self) -> GenerationResult:
        self.stats.new_tokens = len(self.tokens)
        return GenerationResult(torch.tensor(self.tokens, dtype=torch.long), self.stats, self.kinds, self.finish)
