"""Choosing the drafter per request: a router trained on measured speed, and a bandit that tries.

No drafter is fastest on every prompt. Prompt lookup wins where the answer copies the prompt
(summaries, edits, answers quoted from a passage) and costs a little elsewhere; a draft model or
EAGLE wins on open text when its drafts are cheap enough; on a machine where verification is dear
plain decoding can be the fastest of all. A router picks, per request, before the first draft.

:class:`RouterProposer` asks a *policy* once, in ``begin``, and then is the drafter it chose (every
hook forwarded), so it is exactly as lossless as that drafter. The policy reads features that cost
nothing next to decoding (:func:`request_features`): the prompt's length, how much of it repeats
itself (what prompt lookup would find), and the target's own last hidden state pooled over the
prompt, from the prefill the engine runs anyway (no embedding model to download). A seed-style
router: :class:`RouterPolicy` is a ridge regression of each drafter's log speedup over plain
decoding on those features, fitted to per-prompt timings of every drafter
(``measure.routing``), and picks the largest predicted speedup (plain decoding when none is > 0).

:class:`BanditRouter` needs no training: it runs each candidate for a few steps of the request,
measures tokens per second of each, and keeps the best for the rest (drafter selection as a
multi-armed bandit, in the spirit of MetaSD, Kim et al. 2024, and BanditSpec, Hou et al. 2025).
Switching mid-request is safe because verification, not the drafter, decides what is emitted;
a drafter switched in is started on the committed tokens as if they were its prompt, with the
hidden states the router collected for them.

Early exit cannot be routed: it verifies its own draft in the target's cache (``scores_draft``),
which the engine decides before the first step.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .base import DecodeState, Draft, Proposer, StepOutcome, step_hidden_states

PLAIN = "plain"  # the candidate that drafts nothing: plain decoding
#: The cheap features, in the order a policy's weights use them.
TEXT_FEATURES = ("log_prompt_tokens", "self_copy_rate", "repeated_trigrams", "distinct_tokens")


def text_features(ids: Sequence[int]) -> dict:
    """Features of the prompt ids alone, O(length):

    log_prompt_tokens: log of the prompt length (long prompts give prompt lookup more to copy);
    self_copy_rate: the share of positions whose token prompt lookup would have drafted from the
        prompt itself (the last earlier occurrence of the two tokens before it is followed by it);
    repeated_trigrams: the share of the prompt's 3-grams that occur more than once;
    distinct_tokens: distinct ids / length (low: repetitive, templated text).
    """
    ids = [int(t) for t in ids]
    n = len(ids)
    if n == 0:
        raise ValueError("an empty prompt has no features")
    last: dict = {}
    hits = tried = 0
    for i in range(2, n):
        key = (ids[i - 2], ids[i - 1])
        if key in last:
            tried += 1
            hits += ids[last[key]] == ids[i]
        last[key] = i
    trigrams: dict = {}
    for i in range(n - 2):
        trigrams[tuple(ids[i:i + 3])] = trigrams.get(tuple(ids[i:i + 3]), 0) + 1
    repeated = sum(c for c in trigrams.values() if c > 1)
    return {"log_prompt_tokens": math.log(n), "self_copy_rate": hits / max(1, n - 2),
            "repeated_trigrams": repeated / max(1, n - 2), "distinct_tokens": len(set(ids)) / n}


def pooled_hidden(prompt_hidden_states) -> np.ndarray:
    """The target's last-layer hidden state averaged over the prompt's positions: [H] float64.
    prompt_hidden_states: per layer [prompt_len, H] (the engine's ``DecodeState`` field)."""
    if prompt_hidden_states is None:
        raise ValueError("no hidden states: the router reads the prefill's (needs_hidden_states)")
    return prompt_hidden_states[-1].float().mean(0).cpu().double().numpy()


def request_features(state: DecodeState) -> dict:
    """What a policy sees at the start of a request: :func:`text_features` of the prompt and
    ``"hidden"``, the pooled last hidden state (:func:`pooled_hidden`)."""
    return {**text_features(state.token_list[: state.prompt_len]), "hidden": pooled_hidden(state.prompt_hidden_states)}


@torch.inference_mode()
def prompt_features(model, input_ids) -> dict:
    """The features :class:`RouterProposer` computes inside ``generate``, computed offline with one
    prefill (for fitting a policy on measured prompts). input_ids: 1-D LongTensor or list."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1).to(next(model.parameters()).device)
    out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False, logits_to_keep=1)
    return {**text_features(ids.tolist()), "hidden": pooled_hidden(tuple(h[0] for h in out.hidden_states))}


def feature_matrix(features: Sequence[dict]) -> tuple:
    """Rows of :func:`request_features` as arrays: text [N, len(TEXT_FEATURES)], hidden [N, H]."""
    text = np.array([[f[name] for name in TEXT_FEATURES] for f in features], dtype=float)
    hidden = np.stack([np.asarray(f["hidden"], dtype=float) for f in features])
    return text, hidden


@dataclass
class RouterPolicy:
    """Ridge regression of log(speedup over plain) per candidate; picks the largest prediction.

    candidates: names ("plain" included: predicted 0, never fitted). The hidden state enters as its
    first ``n_components`` principal components over the training prompts; every input is
    standardised with the training prompts' mean and spread. weights: [candidates, 1 + inputs].
    """

    candidates: list
    text_mean: np.ndarray
    text_scale: np.ndarray
    hidden_mean: np.ndarray
    components: np.ndarray  # [H, n_components]
    pc_scale: np.ndarray
    weights: np.ndarray
    ridge: float = 1.0
    meta: dict = field(default_factory=dict)

    def inputs(self, text: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """[N, 1 + inputs]: a constant, the standardised text features and principal components."""
        t = (np.atleast_2d(text) - self.text_mean) / self.text_scale
        h = (np.atleast_2d(hidden) - self.hidden_mean) @ self.components / self.pc_scale
        return np.hstack([np.ones((t.shape[0], 1)), t, h])

    def predict(self, text: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        """[N, candidates]: predicted log speedup over plain decoding."""
        return self.inputs(text, hidden) @ self.weights.T

    def __call__(self, features: Mapping) -> str:
        text, hidden = feature_matrix([features])
        return self.candidates[int(np.argmax(self.predict(text, hidden)[0]))]

    @classmethod
    def fit(cls, features: Sequence[dict], log_speedup: np.ndarray, candidates: Sequence[str],
            n_components: int = 4, ridge: float = 1.0, meta: dict | None = None) -> "RouterPolicy":
        """Fit on N prompts: their :func:`request_features` and log_speedup [N, candidates], the
        measured log(plain seconds / candidate seconds) of each prompt (0 in the plain column)."""
        candidates = list(candidates)
        y = np.asarray(log_speedup, dtype=float)
        if y.shape != (len(features), len(candidates)):
            raise ValueError(f"log_speedup must be [prompts, candidates] = {(len(features), len(candidates))}, "
                             f"got {y.shape}")
        if not np.all(np.isfinite(y)):
            raise ValueError("log_speedup holds NaN or inf: every candidate must be timed on every prompt")
        if len(features) < 3:
            raise ValueError(f"fit needs at least 3 prompts, got {len(features)}")
        if ridge < 0:
            raise ValueError(f"ridge must be >= 0, got {ridge!r}")
        text, hidden = feature_matrix(features)
        t_mean, t_scale = text.mean(0), text.std(0) + 1e-9
        h_mean = hidden.mean(0)
        n_comp = int(min(n_components, len(features) - 1, hidden.shape[1]))
        _, sv, vt = np.linalg.svd(hidden - h_mean, full_matrices=False)
        comps = vt[:n_comp].T
        pc_scale = sv[:n_comp] / math.sqrt(len(features)) + 1e-9
        policy = cls(candidates, t_mean, t_scale, h_mean, comps, pc_scale,
                     np.zeros((len(candidates), 1 + text.shape[1] + n_comp)), float(ridge), dict(meta or {}))
        x = policy.inputs(text, hidden)
        penalty = ridge * np.eye(x.shape[1])
        penalty[0, 0] = 0.0  # the constant is not shrunk
        for j, name in enumerate(candidates):
            if name != PLAIN:
                policy.weights[j] = np.linalg.solve(x.T @ x + penalty, x.T @ y[:, j])
        return policy

    def to_json(self, path) -> None:
        arrays = {k: getattr(self, k).tolist() for k in
                  ("text_mean", "text_scale", "hidden_mean", "components", "pc_scale", "weights")}
        Path(path).write_text(json.dumps({"candidates": self.candidates, "text_features": list(TEXT_FEATURES),
                                          "ridge": self.ridge, "meta": self.meta, **arrays}))

    @classmethod
    def from_json(cls, path) -> "RouterPolicy":
        d = json.loads(Path(path).read_text())
        if d.get("text_features") != list(TEXT_FEATURES):
            raise ValueError(f"{path} was fitted on features {d.get('text_features')}, this version computes "
                             f"{list(TEXT_FEATURES)}: fit it again (python -m specdecode_ref.measure.routing)")
        return cls(d["candidates"], *(np.asarray(d[k], dtype=float) for k in
                                      ("text_mean", "text_scale", "hidden_mean", "components", "pc_scale", "weights")),
                   ridge=float(d["ridge"]), meta=d.get("meta", {}))


#: The policy ``load_proposer("router", model)`` uses: fitted to per-prompt timings on the machine
#: named in its ``meta`` (``python -m specdecode_ref.measure.routing fit``).
SHIPPED_POLICY = Path(__file__).resolve().parent.parent / "data" / "router.json"


def shipped_policy() -> RouterPolicy:
    if not SHIPPED_POLICY.exists():
        raise FileNotFoundError(f"{SHIPPED_POLICY} is missing: measure and fit one with "
                                "`python -m specdecode_ref.measure.routing measure` then `... fit`")
    return RouterPolicy.from_json(SHIPPED_POLICY)


def _check_candidates(candidates: Mapping) -> dict:
    if not isinstance(candidates, Mapping) or not candidates:
        raise ValueError("candidates must be a non-empty mapping name -> Proposer (None: plain decoding)")
    for name, p in candidates.items():
        if p is not None and not isinstance(p, Proposer):
            raise TypeError(f"candidate {name!r} must be a Proposer or None, got {type(p).__name__}")
        if p is not None and p.scores_draft:
            raise ValueError(f"candidate {name!r} verifies its own draft in the target's cache (early exit); "
                             "the engine fixes that before the first step, so a router cannot choose it per request")
    return dict(candidates)


class _Routed(Proposer):
    """What both routers share: candidates, the active one, forwarding."""

    def __init__(self, candidates: Mapping):
        self.candidates = _check_candidates(candidates)
        self.active_name: str | None = None

    @property
    def active(self) -> Proposer | None:
        return None if self.active_name is None else self.candidates[self.active_name]

    @property
    def k(self) -> int:
        """The active candidate's k (before a request: the largest any candidate drafts)."""
        if self.active_name is not None:
            return self.active.k if self.active is not None else 1
        return max([p.k for p in self.candidates.values() if p is not None] or [1])

    @k.setter
    def k(self, value) -> None:
        raise AttributeError("a router's k is its candidates': set it on them")

    needs_hidden_states = True  # the pooled prefill state (router) / the catch-up states (bandit)

    @property
    def needs_step_hidden_states(self) -> bool:
        """After the choice, what the chosen drafter needs: plain decoding or prompt lookup chosen
        costs no hidden states on the steps that follow."""
        return self.active is not None and step_hidden_states(self.active)

    @property
    def draft_sampling(self) -> str:
        return self.active.draft_sampling if self.active is not None else "greedy"

    def check_compatible(self, target) -> None:
        for p in self.candidates.values():
            if p is not None:
                p.check_compatible(target)

    def propose(self, state: DecodeState) -> Draft:
        return self.active.propose(state) if self.active is not None else Draft.empty(state.device)

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        if self.active is not None:
            self.active.on_verified(state, outcome)


class RouterProposer(_Routed):
    """The drafter ``policy`` picks for each request (see the module docstring).

    candidates: name -> Proposer, or None for plain decoding. policy: a function of
    :func:`request_features` returning a candidate's name (a fitted :class:`RouterPolicy`, or your
    own). ``choices`` lists every request's pick, in order.
    """

    name = "router"

    def __init__(self, candidates: Mapping, policy: Callable[[Mapping], str]):
        super().__init__(candidates)
        if not callable(policy):
            raise TypeError("policy must be callable: features -> candidate name")
        self.policy = policy
        self.choices: list = []

    def begin(self, state: DecodeState) -> None:
        choice = self.policy(request_features(state))
        if choice not in self.candidates:
            raise ValueError(f"the policy chose {choice!r}, which is not a candidate: {sorted(self.candidates)}")
        self.active_name = choice
        self.choices.append(choice)
        if self.active is not None:
            self.active.begin(state)

    def __repr__(self) -> str:
        return f"RouterProposer(candidates={list(self.candidates)})"


class BanditRouter(_Routed):
    """Tries every candidate for ``probe_steps`` steps of the request, then keeps the one with the
    most tokens per second over its tries (see the module docstring). ``choices``: the kept
    candidate of each request that lasted through the tries; ``trials``: each request's
    {name: [tokens, seconds, steps]} during the tries (a step's seconds run from the start of its
    draft to the end of its verification)."""

    name = "bandit"

    def __init__(self, candidates: Mapping, probe_steps: int = 3):
        super().__init__(candidates)
        if not isinstance(probe_steps, int) or probe_steps < 1:
            raise ValueError(f"probe_steps must be an int >= 1, got {probe_steps!r}")
        self.probe_steps = probe_steps
        self.choices: list = []
        self.trials: list = []

    def begin(self, state: DecodeState) -> None:
        self._order = list(self.candidates)
        self._tally = {name: [0, 0.0, 0] for name in self._order}  # tokens, seconds, steps
        self._hidden = [h for h in state.prompt_hidden_states] if state.prompt_hidden_states is not None else None
        self._exploring = True
        self.trials.append(self._tally)
        self._switch(self._order[0], state, first=True)

    @property
    def needs_step_hidden_states(self) -> bool:
        """While trying candidates: True (a candidate switched to later starts from every committed
        position's states). Once one is kept: what it needs."""
        if getattr(self, "_exploring", False):
            return True
        return self.active is not None and step_hidden_states(self.active)

    def _switch(self, name: str, state: DecodeState, first: bool = False) -> None:
        self.active_name = name
        if self.active is None:
            return
        if first:
            self.active.begin(state)
            return
        # start it on everything committed so far, as if it were the prompt: hidden states cover
        # every committed position but the newest (as after a prefill)
        caught_up = replace(state, prompt_len=len(state.token_list) - 1,
                            prompt_hidden_states=tuple(self._hidden) if self._hidden is not None else None)
        self.active.begin(caught_up)

    def propose(self, state: DecodeState) -> Draft:
        self._t0 = time.perf_counter()
        return super().propose(state)

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        super().on_verified(state, outcome)
        if not self._exploring:
            return
        tally = self._tally[self.active_name]
        tally[0] += len(outcome.emitted)
        tally[1] += time.perf_counter() - self._t0
        tally[2] += 1
        if outcome.hidden_states is not None and self._hidden is not None:
            m = len(outcome.emitted)
            self._hidden = [torch.cat([h, new[:m]]) for h, new in zip(self._hidden, outcome.hidden_states)]
        if tally[2] < self.probe_steps:
            return
        untried = [n for n in self._order if self._tally[n][2] == 0]
        if untried:
            self._switch(untried[0], state)
            return
        best = max(self._order, key=lambda n: self._tally[n][0] / max(self._tally[n][1], 1e-12))
        if best != self.active_name:
            self._switch(best, state)
        self._exploring = False
        self._hidden = None  # no more switches: stop collecting
        self.choices.append(best)

    def __repr__(self) -> str:
        return f"BanditRouter(candidates={list(self.candidates)}, probe_steps={self.probe_steps})"
