"""Self-speculative decoding: draft with the target's own first L layers and a small exit adapter.

The drafter is the target cut short: layers 0..L-1, then a trained *exit adapter* (one decoder
layer, initialised as a copy of the target's last layer), then the target's final norm and lm_head.
Without the adapter, the residual stream at layer L of SmolLM2 agrees with the final argmax only 4-13 %
of the time (notebook 06), which is why LayerSkip (Elhoushi et al., 2024) trains the model itself for
early exit; here the target stays frozen and only the adapter learns
(``python -m specdecode_ref.training early-exit``).

KV reuse (the LayerSkip idea). Draft and target share one KV cache. While drafting, layers 0..L-1
write the drafted tokens' keys and values into the target's own cache and the proposer keeps their
layer-L hidden states. Verification (``score``) then runs only layers L..N-1 for those positions,
starting from the saved hidden states: the first L layers are never recomputed for a drafted token.
This is exact because the draft's layers 0..L-1 *are* the target's, fed the same tokens. With
``reuse_kv=False`` the drafted entries are cropped and verification recomputes everything: notebook 06
measures what reuse saves. The adapter's own attention keeps a one-layer cache with the same
invariant as the target's (every committed token except the last).

Counterparts: LayerSkip's self-speculation (facebookresearch/LayerSkip, ``self_speculation/``);
transformers' ``assistant_early_exit`` (``EarlyExitCandidateGenerator``), which shares weights but
not the cache.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from .. import kv
from .vocab import VocabHead
from ..sampling import logits_to_probs
from .base import DecodeState, Draft, Proposer, StepOutcome
from .draft_model import WEIGHTS_DIR, _require_embedded

EXIT_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-exit-adapters.safetensors"


def causal_mask(q_len: int, past_len: int, device=None) -> torch.Tensor:
    """Boolean [1, 1, q, past+q]: query i (at position past+i) sees keys 0..past+i."""
    rows = torch.arange(q_len, device=device)[:, None] + past_len
    cols = torch.arange(past_len + q_len, device=device)[None, :]
    return (cols <= rows)[None, None]


def run_layers(target, hidden, positions, layers, cache=None, mask=None):
    """Run the target's decoder ``layers`` (an index range) on ``hidden`` [B, q, H] at ``positions``
    [B, q]: the slice of the model's own forward that self-speculation needs (HF modules, HF cache)."""
    base = target.model
    pe = base.rotary_emb(hidden, position_ids=positions)
    for i in layers:
        hidden = base.layers[i](hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                use_cache=cache is not None, position_embeddings=pe)
    return hidden


class ExitAdapter(torch.nn.Module):
    """One decoder layer plus a final norm, mapping the residual stream at the exit layer to
    something the target's lm_head can read. Its attention has its own one-layer KV cache."""

    def __init__(self, layer: torch.nn.Module, norm: torch.nn.Module, exit_layer: int):
        super().__init__()
        self.layer = layer
        self.layer.self_attn.layer_idx = 0
        self.norm = norm
        self.exit_layer = int(exit_layer)

    def forward(self, hidden, positions, mask, target, cache=None):
        pe = target.model.rotary_emb(hidden, position_ids=positions)
        h = self.layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=cache is not None, position_embeddings=pe)
        return self.norm(h)


def build_adapter(target, exit_layer: int) -> ExitAdapter:
    """An adapter initialised from the target's last layer and final norm (both copied)."""
    n = target.config.num_hidden_layers
    if not 1 <= exit_layer < n:
        raise ValueError(f"exit_layer must be in [1, {n - 1}] for a {n}-layer target, got {exit_layer}")
    return ExitAdapter(copy.deepcopy(target.model.layers[n - 1]), copy.deepcopy(target.model.norm), exit_layer)


def save_adapters(adapters: dict, path=EXIT_WEIGHTS, meta: dict | None = None) -> Path:
    from safetensors.torch import save_file

    state = {}
    for L, a in adapters.items():
        for k, v in a.state_dict().items():
            state[f"exit{L}.{k}"] = v.detach().to(torch.bfloat16).contiguous()
    meta = dict(meta or {})
    meta["exits"] = json.dumps(sorted(int(L) for L in adapters))
    save_file(state, str(path), metadata={k: str(v) for k, v in meta.items()})
    return Path(path)


def shipped_exits(path=EXIT_WEIGHTS) -> list:
    from .draft_model import weights_metadata

    return json.loads(weights_metadata(path)["exits"])


def load_adapter(target, exit_layer: int | None = None, path=EXIT_WEIGHTS) -> ExitAdapter:
    """The shipped adapter for ``exit_layer`` (default: the first shipped one)."""
    from safetensors.torch import load_file

    _require_embedded(target, "exit adapter")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; train it with `python -m specdecode_ref.training early-exit`")
    exits = shipped_exits(path)
    exit_layer = exits[0] if exit_layer is None else int(exit_layer)
    if exit_layer not in exits:
        raise ValueError(f"no shipped adapter for exit layer {exit_layer}; shipped: {exits}")
    adapter = build_adapter(target, exit_layer)
    prefix = f"exit{exit_layer}."
    param = next(target.parameters())
    state = {k[len(prefix):]: v.to(param.dtype) for k, v in load_file(str(path)).items() if k.startswith(prefix)}
    adapter.load_state_dict(state)
    return adapter.to(param.device).eval().requires_grad_(False)


class EarlyExitProposer(Proposer):
    """Draft with the target's first ``adapter.exit_layer`` layers + the exit adapter.

    reuse_kv: verification skips layers 0..L-1 for drafted tokens (shared cache). draft_vocab: an
    optional frequency-ranked subset for the draft's vocabulary projection (draft_vocab.py).
    """

    name = "early-exit"
    needs_hidden_states = True  # the prompt's layer-L states prefill the adapter's cache
    scores_draft = True  # the engine lets score() run the verification forward (KV reuse)

    def __init__(self, target, adapter: ExitAdapter, k: int = 3, draft_vocab=None, reuse_kv: bool = True):
        super().__init__(k)
        self.target = target
        self.adapter = adapter
        self.L = adapter.exit_layer
        self.reuse_kv = reuse_kv
        self.head = VocabHead(target.get_output_embeddings().weight, draft_vocab)
        self.cache = None
        self.adapter_cache = None
        self._h = []  # layer-L hidden states of the tokens drafted this step: last committed, d1, ...
        self._scored_h = (0, None)  # (first position, layer-L states) of the last verification forward

    def check_compatible(self, target) -> None:
        if target is not self.target:
            raise ValueError("an EarlyExitProposer drafts with the layers of the target it was built for; "
                             "pass that same model to generate()")
        base = getattr(target, "model", None)
        if base is None or not hasattr(base, "layers") or not hasattr(base, "rotary_emb"):
            raise ValueError("early exit needs a Llama-style decoder (model.layers, model.rotary_emb)")

    @property
    def _device(self):
        return next(self.target.parameters()).device

    def begin(self, state: DecodeState) -> None:
        if state.target_cache is None or state.prompt_hidden_states is None:
            raise RuntimeError("EarlyExitProposer needs the engine's shared cache and the prompt's hidden states")
        self.cache = state.target_cache
        self.adapter_cache = kv.new_cache()
        h = state.prompt_hidden_states[self.L][None]  # [1, P, H]: the residual stream entering layer L
        P = h.shape[1]
        pos = torch.arange(P, device=self._device)[None]
        self.adapter(h, pos, causal_mask(P, 0, self._device), self.target, self.adapter_cache)
        self._h = []

    def _draft_step(self, token: int, position: int) -> torch.Tensor:
        """Token at ``position`` through layers 0..L-1 (into the shared cache) and the adapter."""
        x = self.target.model.embed_tokens(torch.tensor([[token]], device=self._device))
        pos = torch.tensor([[position]], device=self._device)
        h = run_layers(self.target, x, pos, range(self.L), self.cache)
        self._h.append(h)
        out = self.adapter(h, pos, None, self.target, self.adapter_cache)
        return self.head.logits(out[0, -1])

    def _choose(self, logits, state):
        if state.sampling.is_greedy:
            return int(self.head.to_token(logits.argmax())), None
        q = logits_to_probs(self.head.full_logits(logits).float(), state.sampling)
        return int(torch.multinomial(q, 1, generator=state.generator)), q

    def propose(self, state: DecodeState) -> Draft:
        if self.cache is None:
            raise RuntimeError("propose() before begin()")
        n = len(state.token_list)
        self._h = []
        token, tokens, probs = state.token_list[-1], [], []
        for i in range(self.k):
            tok, q = self._choose(self._draft_step(token, n - 1 + i), state)
            tokens.append(tok)
            if q is not None:
                probs.append(q)
            token = tok
        return Draft(torch.tensor(tokens, dtype=torch.long, device=self._device),
                     torch.stack(probs) if probs else None)

    def score(self, state: DecodeState, ids: list):
        """The verification forward over ``ids`` = [last committed] + draft, in the shared cache.
        Returns the target's logits [len(ids), V]."""
        n = len(state.token_list)  # the cache holds n - 1 committed positions in layers L..N-1
        m = len(ids)
        early = range(self.L)
        if not self.reuse_kv or m > len(self._h) + 1:
            kv.crop_layers_to(self.cache, n - 1, early)
            out = self.target(input_ids=torch.tensor([ids], device=self._device), past_key_values=self.cache,
                              use_cache=True, output_hidden_states=True)
            self._scored_h = (n - 1, out.hidden_states[self.L])
            return out.logits[0]
        # Layers 0..L-1 already hold the last committed token and d1..d_{k-1}; keep what is scored.
        have = min(m, len(self._h))
        kv.crop_layers_to(self.cache, n - 1 + have, early)
        hs = self._h[:have]
        if m > have:  # the last draft token never went through the early layers
            x = self.target.model.embed_tokens(torch.tensor([[ids[-1]]], device=self._device))
            hs.append(run_layers(self.target, x, torch.tensor([[n - 1 + have]], device=self._device), early,
                                 self.cache))
        h = torch.cat(hs, dim=1)
        self._scored_h = (n - 1, h)  # layer-L states of every scored position, for on_verified
        pos = torch.arange(n - 1, n - 1 + m, device=self._device)[None]
        h = run_layers(self.target, h, pos, range(self.L, self.target.config.num_hidden_layers), self.cache,
                       causal_mask(m, n - 1, self._device) if m > 1 else None)
        return self.target.lm_head(self.target.model.norm(h))[0]

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        committed_before = len(state.token_list) - len(outcome.emitted)
        keep = min(kv.cache_len(self.adapter_cache), committed_before + outcome.num_accepted)
        kv.crop_to(self.adapter_cache, keep)
        # When every draft was accepted, the last one never went through the adapter: catch up from
        # the layer-L states verification computed, so the adapter cache again holds every
        # committed token but the last.
        start, h = self._scored_h
        have, want = kv.cache_len(self.adapter_cache), len(state.token_list) - 1
        if have < want and start <= have and want <= start + h.shape[1]:
            pos = torch.arange(have, want, device=self._device)[None]
            self.adapter(h[:, have - start: want - start], pos, causal_mask(want - have, have, self._device),
                         self.target, self.adapter_cache)
        self._h = []

    def __repr__(self) -> str:
        return (f"EarlyExitProposer(k={self.k}, exit_layer={self.L}, reuse_kv={self.reuse_kv}, "
                f"draft_vocab={self.head.size})")
