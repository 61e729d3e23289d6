"""Looking inside self-speculative decoding: how early does the target know its next token, and which
of its layers run for which positions when it drafts for itself.

Self-speculation drafts with the target cut short: exit after the first L layers (LayerSkip,
Elhoushi et al. 2024; Kangaroo, Liu et al. 2024) or skip a block of layers (Draft & Verify, Zhang et
al. 2023). Whether that can work *without training* is a question about the model, answered here by
measuring top-1 agreement with the full model on the target's own text:

* :func:`exit_agreement` -- the "logit lens": apply the final norm and the lm_head to the residual
  stream after layer L and compare its argmax with the full model's, for every L;
* :func:`skip_agreement` -- run every layer except a contiguous block of ``s`` layers (by default in
  the middle of the network) and compare likewise.

Agreement with the full model's argmax is exactly what greedy verification accepts at the first
draft position, so it is an upper bound on a draft's per-token acceptance without an adapter.

:func:`verification_paths` times one verification forward through the model's own forward and
through the course's layer loop, the two paths self-speculation's speedup is measured across.

:class:`LayerCallTrace` records every decoder-layer call during a speculative run (which layer, which
positions, in which phase: prefill, draft, verify) and :func:`schedule_table` turns one step of it
into a table, making the KV reuse of ``EarlyExitProposer(reuse_kv=True)`` visible. Notebook 06 uses
all of it.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from .. import decoder
from ..decoder import run_layers
from ..masks import causal_mask


# ---- sequences to measure on ------------------------------------------------------------------------

@dataclass
class AnswerSequence:
    """A prompt followed by the target's own answer: ``ids`` [T], answer tokens from ``start`` on."""

    ids: torch.Tensor
    start: int

    @property
    def positions(self) -> torch.Tensor:
        """Positions whose next-token prediction is an answer token: start-1 .. T-2."""
        return torch.arange(self.start - 1, self.ids.numel() - 1)


def answer_sequences(model, prompts: Iterable[torch.Tensor], max_new_tokens: int = 48) -> list:
    """The target's greedy answers to ``prompts`` (1-D id tensors), as :class:`AnswerSequence` objects.

    Measuring on the target's *own* text matters: that is the text a drafter has to predict.
    """
    from ..engine import autoregressive_generate

    out = []
    for p in prompts:
        p = torch.as_tensor(p).reshape(-1).cpu()
        res = autoregressive_generate(model, p, max_new_tokens=max_new_tokens)
        out.append(AnswerSequence(torch.cat([p, res.tokens.cpu()]), int(p.numel())))
    return out


def _as_sequences(sequences) -> list:
    seqs = []
    for s in sequences:
        if isinstance(s, AnswerSequence):
            seqs.append(s)
        else:  # (ids, start)
            ids, start = s
            seqs.append(AnswerSequence(torch.as_tensor(ids).reshape(-1), int(start)))
    for s in seqs:
        if not 1 <= s.start < s.ids.numel():
            raise ValueError(f"answer start {s.start} must lie in [1, {s.ids.numel() - 1}] for {s.ids.numel()} ids")
    return seqs


# ---- logit lens and layer skipping --------------------------------------------------------------------

def _device(model):
    return next(model.parameters()).device


@torch.no_grad()
def residual_stream(model, ids: torch.Tensor) -> list:
    """The residual stream of one sequence: N+1 tensors [T, H], entry L = the input to layer L
    (entry 0 = the embeddings, entry N = the last layer's output, before the final norm)."""
    dev = _device(model)
    x = torch.as_tensor(ids, device=dev).reshape(1, -1)
    T = x.shape[1]
    h = decoder.embed(model, x)
    pos = torch.arange(T, device=dev)[None]
    mask = causal_mask(T, 0, dev)
    states = [h[0]]
    for i in range(decoder.num_layers(model)):
        h = run_layers(model, h, pos, [i], None, mask)
        states.append(h[0])
    return states


@torch.no_grad()
def exit_agreement(model, sequences, layers: Sequence[int] | None = None, topk: int = 5) -> dict:
    """Agreement of the logit-lens exit after each layer with the full model, on answer positions.

    For each exit layer L (default 1..N), the draft's token is argmax lm_head(norm(h_L)), with h_L the
    residual stream after L layers. Returns ``{"layers": [...], "top1": [...], f"top{topk}": [...],
    "positions": n}``: top1 = share of positions whose exit argmax equals the full model's argmax;
    top{topk} = share whose full-model argmax is among the exit's ``topk`` best tokens.
    """
    seqs = _as_sequences(sequences)
    n_layers = model.config.num_hidden_layers
    layers = list(range(1, n_layers + 1)) if layers is None else [int(L) for L in layers]
    if any(not 1 <= L <= n_layers for L in layers):
        raise ValueError(f"exit layers must lie in [1, {n_layers}], got {layers}")
    hit1 = torch.zeros(len(layers))
    hitk = torch.zeros(len(layers))
    total = 0
    for s in seqs:
        states = residual_stream(model, s.ids)
        pos = s.positions.to(states[0].device)
        final = decoder.logits_from_residual(model, states[n_layers][pos]).argmax(-1)
        for j, L in enumerate(layers):
            logits = decoder.logits_from_residual(model, states[L][pos])
            hit1[j] += (logits.argmax(-1) == final).sum().item()
            top = logits.topk(topk, dim=-1).indices
            hitk[j] += (top == final[:, None]).any(-1).sum().item()
        total += int(pos.numel())
    return {"layers": layers, "top1": (hit1 / total).tolist(), f"top{topk}": (hitk / total).tolist(),
            "positions": total}


def middle_block(n_layers: int, num_skipped: int) -> range:
    """The contiguous block of ``num_skipped`` layers centred in an ``n_layers`` network."""
    if not 0 <= num_skipped < n_layers:
        raise ValueError(f"num_skipped must lie in [0, {n_layers - 1}], got {num_skipped}")
    first = (n_layers - num_skipped) // 2
    return range(first, first + num_skipped)


@torch.no_grad()
def skip_predictions(model, ids: torch.Tensor, skip: Iterable[int], positions=None) -> torch.Tensor:
    """Argmax next tokens of the model run with the layers in ``skip`` left out (at ``positions``,
    default all): the draft of Draft & Verify-style layer skipping, without a KV cache."""
    dev = _device(model)
    skip = set(int(i) for i in skip)
    keep = [i for i in range(model.config.num_hidden_layers) if i not in skip]
    x = torch.as_tensor(ids, device=dev).reshape(1, -1)
    T = x.shape[1]
    h = run_layers(model, decoder.embed(model, x), torch.arange(T, device=dev)[None], keep, None,
                   causal_mask(T, 0, dev))[0]
    if positions is not None:
        h = h[torch.as_tensor(positions, device=dev)]
    return decoder.logits_from_residual(model, h).argmax(-1)


@torch.no_grad()
def skip_agreement(model, sequences, num_skipped: Sequence[int], where: str = "middle") -> dict:
    """Top-1 agreement with the full model when a contiguous block of ``s`` layers is skipped, for
    each s in ``num_skipped``. where: "middle" (a centred block, :func:`middle_block`) or "end"
    (the last s layers: the same as exiting after layer N - s, i.e. the logit lens).
    Returns ``{"num_skipped": [...], "top1": [...], "blocks": [range, ...], "positions": n}``."""
    if where not in ("middle", "end"):
        raise ValueError(f"where must be 'middle' or 'end', got {where!r}")
    seqs = _as_sequences(sequences)
    n_layers = model.config.num_hidden_layers
    blocks = []
    for s in num_skipped:
        if where == "middle":
            blocks.append(middle_block(n_layers, int(s)))
        else:
            if not 0 <= s < n_layers:
                raise ValueError(f"num_skipped must lie in [0, {n_layers - 1}], got {s}")
            blocks.append(range(n_layers - int(s), n_layers))
    hits = torch.zeros(len(blocks))
    total = 0
    for seq in seqs:
        full = skip_predictions(model, seq.ids, [], seq.positions)
        for j, block in enumerate(blocks):
            hits[j] += (skip_predictions(model, seq.ids, block, seq.positions) == full).sum().item()
        total += int(seq.positions.numel())
    return {"num_skipped": [int(s) for s in num_skipped], "top1": (hits / total).tolist(), "blocks": blocks,
            "positions": total}


# ---- which layers run for which positions -------------------------------------------------------------

@dataclass
class LayerCall:
    phase: str  # "prefill", "begin", "draft", "verify" or "catch-up"
    step: int  # speculative step (0 = the first propose call; -1 before it)
    module: str  # "layer i" or "adapter"
    layer: int  # decoder layer index; -1 for the adapter
    positions: tuple  # sequence positions this call processed


@dataclass
class LayerCallTrace:
    """Every decoder-layer call of the target (and of an early-exit adapter) during a run.

    Use as ``with trace.recording(): generate(model, ids, proposer=proposer, ...)``. The phase is
    known by wrapping the proposer's ``begin`` / ``propose`` / ``score`` / ``on_verified`` for the
    duration; calls outside them are the engine's own target forwards ("prefill" before the first
    step, "verify" after it).
    """

    model: torch.nn.Module
    proposer: object = None
    calls: list = field(default_factory=list)

    @contextmanager
    def recording(self):
        state = {"phase": "prefill", "step": -1}
        handles, saved = [], {}

        def hook_for(name, idx):
            def hook(module, args, kwargs):
                pos = kwargs.get("position_ids")
                hidden = args[0] if args else kwargs.get("hidden_states")
                if pos is None:
                    positions = tuple(range(hidden.shape[1]))
                else:
                    positions = tuple(int(p) for p in pos.reshape(-1)[-hidden.shape[1]:].tolist())
                self.calls.append(LayerCall(state["phase"], state["step"], name, idx, positions))
            return hook

        for i in range(decoder.num_layers(self.model)):
            layer = decoder.layer(self.model, i)
            handles.append(layer.register_forward_pre_hook(hook_for(f"layer {i}", i), with_kwargs=True))
        adapter = getattr(self.proposer, "adapter", None)
        if adapter is not None:
            handles.append(adapter.layer.register_forward_pre_hook(hook_for("adapter", -1), with_kwargs=True))

        def wrap(name, phase, new_step=False):
            fn = getattr(self.proposer, name)
            saved[name] = self.proposer.__dict__.get(name)

            def wrapped(*a, **kw):
                if new_step:
                    state["step"] += 1
                state["phase"] = phase
                try:
                    return fn(*a, **kw)
                finally:
                    # Outside the proposer, a target forward is the prefill (before the first
                    # step) or the engine's own verification forward (after it).
                    state["phase"] = "prefill" if state["step"] < 0 else "verify"

            setattr(self.proposer, name, wrapped)

        try:
            if self.proposer is not None:
                wrap("begin", "begin")
                wrap("propose", "draft", new_step=True)
                if self.proposer.scores_draft:  # it runs the verification forward itself
                    wrap("score", "verify")
                wrap("on_verified", "catch-up")
            yield self
        finally:
            for h in handles:
                h.remove()
            for name, old in saved.items():
                if old is None:
                    self.proposer.__dict__.pop(name, None)
                else:
                    setattr(self.proposer, name, old)

    def step_calls(self, step: int) -> list:
        return [c for c in self.calls if c.step == step]


def schedule_table(trace: LayerCallTrace, step: int, exit_layer: int, k: int | None = None):
    """Which layer groups processed which positions, and in which phase, during one speculative step.

    Rows: "layers 0..L-1", "layers L..N-1", "exit adapter"; columns: the step's positions, labelled
    "t" (the last committed token) and "d1".."dk" (drafted tokens). A cell lists the phases in which
    *every* layer of the group processed that position ("draft", "verify", "draft, verify" = computed
    twice) or "-" (not run). Returns a pandas DataFrame.
    """
    import pandas as pd

    calls = trace.step_calls(step)
    if not calls:
        raise ValueError(f"no layer calls recorded for step {step}")
    n_layers = trace.model.config.num_hidden_layers
    first_draft = [c for c in calls if c.phase == "draft"]
    start = min(min(c.positions) for c in (first_draft or calls))
    last = max(max(c.positions) for c in calls if c.phase in ("draft", "verify"))
    k = last - start if k is None else int(k)
    cols = list(range(start, start + k + 1))
    labels = ["t"] + [f"d{i}" for i in range(1, k + 1)]
    groups = {f"layers 0..{exit_layer - 1}": range(0, exit_layer),
              f"layers {exit_layer}..{n_layers - 1}": range(exit_layer, n_layers),
              "exit adapter": [-1]}
    table = {}
    for gname, members in groups.items():
        row = []
        for p in cols:
            phases = []
            for ph in ("draft", "verify", "catch-up"):
                done = {c.layer for c in calls if c.phase == ph and p in c.positions and c.layer in members}
                if done and done == set(members):
                    phases.append(ph)
            row.append(", ".join(phases) if phases else "-")
        table[gname] = row
    return pd.DataFrame(table, index=labels).T


def count_layer_positions(trace: LayerCallTrace, phase: str | None = None, step: int | None = None) -> int:
    """Total (layer, position) pairs computed by the target's own layers (adapter excluded), optionally
    restricted to one phase and/or step: the work a schedule does, in layer-token units."""
    return sum(len(c.positions) for c in trace.calls if c.layer >= 0 and (phase is None or c.phase == phase)
               and (step is None or c.step == step))


__all__ = ["AnswerSequence", "answer_sequences", "residual_stream", "exit_agreement", "middle_block",
           "skip_predictions", "skip_agreement", "LayerCall", "LayerCallTrace", "schedule_table",
           "count_layer_positions"]


# ---- the two ways to run a verification forward -------------------------------------------------------

def verification_paths(model, n: int, context_len: int = 256, repeats: int = 9, warmup: int = 2,
                       seed: int = 0) -> dict:
    """Seconds for one verification forward of ``n`` positions after a cached ``context_len``-token
    context, run two ways on the same input: the model's own forward (what plain decoding and most
    drafters verify with) and the course's loop over the decoder layers (``decoder.run_layers``, what
    the early exit verifies with). Self-speculation's speedup over plain decoding includes any
    difference between the two, which is not drafting's doing, so notebook 06 measures it.

    Rounds alternate which path runs first; ``warmup`` rounds are discarded, the median is kept. The
    two paths' logits must agree (to float tolerance), or the comparison would be of different work.
    Returns ``{"n", "context_len", "forward_s", "loop_s", "loop_over_forward"}``.
    """
    from .. import kv
    from .harness.timing import sync_device

    if not isinstance(n, int) or n < 1 or not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"n and context_len must be ints >= 1, got n={n!r}, context_len={context_len!r}")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError("repeats must be an int >= 1 and warmup an int >= 0")
    device = _device(model)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().weight.shape[0]
    context = torch.randint(0, vocab, (1, context_len), generator=gen).to(device)
    new = torch.randint(0, vocab, (1, n), generator=gen).to(device)
    cache = kv.new_cache(model)
    with torch.no_grad():
        model(input_ids=context, past_key_values=cache, use_cache=True, logits_to_keep=1)
    pos = torch.arange(context_len, context_len + n, device=device)[None]
    mask = causal_mask(n, context_len, device) if n > 1 else None
    layers = range(decoder.num_layers(model))

    def forward():
        return model(input_ids=new, past_key_values=cache, use_cache=True).logits[0]

    def loop():
        h = run_layers(model, decoder.embed(model, new), pos, layers, cache, mask)
        return decoder.logits_from_residual(model, h)[0]

    paths = {"forward_s": forward, "loop_s": loop}
    samples = {name: [] for name in paths}
    logits = {}
    with torch.no_grad():
        for r in range(warmup + repeats):
            for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                sync_device(device)
                t0 = time.perf_counter()
                logits[name] = paths[name]()
                sync_device(device)
                dt = time.perf_counter() - t0
                kv.crop_to(cache, context_len)
                if r >= warmup:
                    samples[name].append(dt)
    a, b = logits["forward_s"].float(), logits["loop_s"].float()
    tol = 1e-3 if a.dtype == torch.float32 and model.dtype == torch.float32 else 0.25
    if not torch.allclose(a, b, atol=tol, rtol=0):
        raise AssertionError(f"the layer loop's logits differ from the forward's by {float((a - b).abs().max()):.3g}")
    out = {name: float(statistics.median(s)) for name, s in samples.items()}
    return {"n": n, "context_len": context_len, **out, "loop_over_forward": out["loop_s"] / out["forward_s"]}
