"""EAGLE: draft at the feature level, one small decoder layer on top of the target's own features.

Li et al. (2024), "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (EAGLE-1), and
"EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (the tree here).

**The idea.** Predicting the next *token* is hard for a small drafter; predicting the next *feature*
(the target's top-layer hidden state) is easier, because features move smoothly, and the target's
own lm_head then turns a predicted feature into a token for free. The uncertainty that makes
feature prediction ambiguous is which token was actually sampled, so the head also reads that
token: its input at position t is ``[f_t, emb(x_{t+1})]``.

**The head.** ``fc``: a linear fuse 2H -> H, then ONE Llama decoder layer (initialised as a copy of
the target's last layer, with its own one-layer KV cache) and a copy of the target's final norm.
The target's embeddings and lm_head are shared and frozen (the lm_head may be restricted to the
reduced draft vocabulary, vocab.py).

**The feature** is the target's *final normed* hidden state: what ``hidden_states[-1]`` of a
transformers forward and ``Corpus.hidden`` hold, i.e. exactly what the lm_head reads. (EAGLE's
code also takes the base model's output after its final norm.) The head therefore ends with a
norm, and ``lm_head(f̂)`` needs nothing in between.

**Indexing.** The head's output at position t is f̂_{t+1}; ``lm_head(f̂_{t+1})`` predicts x_{t+2}.
With N committed tokens the target has scored positions 0..N-2 (the newest token waits for the
next verification forward), so real features are known for 0..N-2 and tokens for 0..N-1: the
head's cache holds the inputs of positions 0..N-2, and its output at N-2 (f̂_{N-1}) gives the
first draft token x_N. Drafting continues from there on the head's *own* predicted features:
input ``[f̂_{N-1}, emb(d1)]`` at position N-1 gives f̂_N and d2, and so on.

**Rollback.** Drafted cache entries were computed from predicted features, so after verification
the head's cache is cropped back to the committed state before the step and the accepted tokens are
fed again with the *real* features the engine passes (``StepOutcome.hidden_states[-1]``: the root
and the accepted path). The cache then again holds exactly what a fresh pass over
``[f_t, emb(x_{t+1})]``, t = 0..N-2, would give.

**Chain or tree.** Chain mode drafts k tokens (greedy, or sampled from q with q returned). Tree
mode (EAGLE-2's dynamic tree) grows a tree by draft confidence: at every depth it expands the
``beam`` nodes of that depth with the best cumulative log-probability, each with its ``branch``
most likely children, for ``depth`` levels; then keeps the ``k`` best nodes by cumulative
log-probability (a parent always scores at least as well as its children, so kept nodes keep their
parents). One head forward per level scores all expanded nodes at once with a tree attention mask
over the head's own cache (trees.py). Tree candidates are deterministic top-k, so ``probs`` is
None: the engine's multi-candidate verification stays lossless with one-hot q.

**EAGLE-3's fused head** (Li et al., 2025, "EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test"; :class:`FusedEagleHead`). Two changes. (1) The feature at a
committed position is no longer the top layer alone but the target's low, middle and high hidden
states concatenated, [3H], projected to H by its own linear ``fuse``: the top layer is shaped for
predicting the next token only, while lower layers still carry what later tokens need. The layers
are EAGLE-3's rule, the inputs of layers 2, N/2 and N-3 (``eagle3_layers``: 2, 15, 27 of the 30 here).
At drafted positions the head reads its *own* previous output in place of the fused feature (there
is no target feature there), so its output is a hidden state to pass on, no longer a prediction of
the target's feature: it is trained on tokens alone, and ``readout`` (its norm) gives the lm_head's
input. Its layer reads the normed token embedding and the normed feature side by side (q, k, v read
2H) with the feature as the residual, exactly as vLLM's ``Eagle3LlamaForCausalLM`` computes it, so
``serving.export.export_eagle3_head`` writes it for vLLM without changing the function. (2) The head
drafts over a frequency-ranked reduced vocabulary (vocab.py): the target's tied lm_head rows for
those ids, frozen, so the file stores only the id map beside the head.

Train the head with ``python -m specdecode_ref.training eagle`` (teacher forcing on the distillation
corpus: no target forward is needed, the corpus holds the features); the fused head with
``python -m specdecode_ref.training fused-features`` (adds the fused features to the corpus) then
``python -m specdecode_ref.training eagle --features fused``.

Counterparts: SafeAILab/EAGLE ``eagle/model/cnets.py`` (the head, ``topK_genrate``: the dynamic
tree), ``eagle/model/utils.py`` (tree buffers, verification, cache update),
``eagle/traineagle3/cnets.py`` (EAGLE-3's fused head and its training-time test); vLLM
``vllm/v1/spec_decode/eagle.py``; transformers has no EAGLE head.
"""
from __future__ import annotations

import copy
import json

import torch

from .. import decoder, kv, trees
from ..masks import causal_additive_mask, tree_attention_mask
from .base import DecodeState, Draft, Proposer, StepOutcome, resolve_draft_sampling, with_sizing
from .drafting import draft_chain
from .shipped import (WEIGHTS_DIR, load_weights, require_embedded, require_file, require_same_target, save_weights,
                      shipped_vocab, weights_metadata)
from .vocab import VocabHead

EAGLE_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-eagle.safetensors"
EAGLE3_WEIGHTS = WEIGHTS_DIR / "smollm2-135m-eagle3.safetensors"
EAGLE3_FORMAT = "eagle3-head-v2"  # v2: EAGLE-3's own layer (token and feature side by side, as vLLM loads it)


def eagle3_layers(num_layers: int) -> tuple:
    """EAGLE-3's low, middle and high features: the hidden states entering layers 2, N // 2 and N - 3
    (entries of the transformers ``hidden_states`` tuple; (2, 15, 27) for a 30-layer target). It
    skips the top layers, which specialise in the very next token."""
    if num_layers < 6:
        raise ValueError(f"a {num_layers}-layer target has no distinct low, middle and high layers; "
                         "pass feature_layers")
    return (2, num_layers // 2, num_layers - 3)


class EagleHead(torch.nn.Module):
    """f̂_{t+1} = norm(layer(fc([f_t, emb(x_{t+1})]))): the feature-level drafter.

    ``fc``, ``layer`` and ``norm`` are its own (trained) weights; the token embeddings and the
    lm_head are the target's and are read through ``target`` at call time, never copied.
    """

    features = "final"  # what it reads at committed positions: the final normed hidden state
    feature_layers = None

    def __init__(self, layer: torch.nn.Module, norm: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.fc = torch.nn.Linear(2 * hidden_size, hidden_size, bias=True)
        self.layer = layer
        self.layer.self_attn.layer_idx = 0  # its own one-layer cache
        self.norm = norm
        self.register_buffer("draft_ids", None)  # drafts over the full vocabulary unless a proposer says

    def target_features(self, hidden_states: tuple) -> torch.Tensor:
        """The head's input feature at committed positions, from the target's per-layer hidden states
        (the engine's tuple, each [..., H]): f_t, the final normed state."""
        return hidden_states[-1]

    def readout(self, out: torch.Tensor) -> torch.Tensor:
        """What the lm_head reads from the head's output: f̂ itself (the head ends with the norm)."""
        return out

    def _layer(self, feature, tokens, positions, mask, target, cache):
        emb = decoder.embed(target, tokens).to(feature.dtype)
        x = self.fc(torch.cat([feature, emb], dim=-1))
        rope = decoder.rotary(target, x, positions)
        return decoder.run_layer(self.layer, x, positions, rope, cache, mask)

    def forward(self, features, tokens, positions, mask, target, cache=None):
        """features [B, q, H] (f_t), tokens [B, q] (x_{t+1}), positions [B, q] (t) -> f̂_{t+1} [B, q, H].

        mask: a 4D mask over the cache plus the new entries (None for a single query: sees everything).
        """
        return self.norm(self._layer(features, tokens, positions, mask, target, cache))


class FusedEagleHead(torch.nn.Module):
    """EAGLE-3's head, in the layout EAGLE-3's own code and vLLM load (``Eagle3LlamaForCausalLM``).

    At a committed position t the head reads g_t = fuse([low_t, mid_t, high_t]) (3H -> H, no bias);
    at a drafted position it reads g_t = h_t, its own previous output. Its one decoder layer then
    sees the token and the feature side by side instead of summed:

        x   = [input_layernorm(emb(x_{t+1})), hidden_norm(g_t)]        [2H]: q, k and v read 2H
        r   = g_t + o_proj(attention(x))                               the residual is the feature
        h_{t+1} = r + mlp(post_attention_layernorm(r))                 passed on to the next step
        logits  = lm_head(norm(h_{t+1}))                               over the draft vocabulary

    ``norm_before_residual`` (a vLLM config field) takes the residual after ``hidden_norm`` instead.
    ``draft_ids`` (LongTensor or None) is the reduced vocabulary it drafts over, stored in its file;
    the lm_head rows are the target's for those ids, frozen.

    No feature loss: the output is the hidden state the next draft step reads, not a prediction of
    any target feature (the fused input is three layers, the fed-back one is the head's own), so the
    head is trained on its tokens alone, as EAGLE-3 does; fitting a feature target would only
    constrain what the head may pass to itself.
    """

    features = "fused"

    def __init__(self, layer: torch.nn.Module, norm: torch.nn.Module, hidden_size: int, feature_layers,
                 draft_ids: torch.Tensor | None = None, norm_before_residual: bool = False):
        super().__init__()
        self.feature_layers = tuple(int(i) for i in feature_layers)
        if len(self.feature_layers) < 2:
            raise ValueError(f"a fused head reads at least two layers, got {self.feature_layers}")
        self.fuse = torch.nn.Linear(len(self.feature_layers) * hidden_size, hidden_size, bias=False)
        attn = layer.self_attn
        if attn.q_proj.in_features != 2 * hidden_size:
            raise ValueError(f"EAGLE-3's layer reads [token, feature] ({2 * hidden_size} inputs); this one reads "
                             f"{attn.q_proj.in_features}: build it with build_eagle_head(..., 'fused')")
        self.layer = layer
        self.layer.self_attn.layer_idx = 0  # its own one-layer cache
        self.hidden_norm = copy.deepcopy(layer.input_layernorm)
        self.norm = norm
        self.norm_before_residual = bool(norm_before_residual)
        self.register_buffer("draft_ids", None if draft_ids is None else torch.as_tensor(draft_ids, dtype=torch.long))

    def target_features(self, hidden_states: tuple) -> torch.Tensor:
        """The fused feature [..., 3H]: the hidden states entering ``feature_layers``, concatenated."""
        return decoder.fused_hidden(hidden_states, self.feature_layers)

    def readout(self, out: torch.Tensor) -> torch.Tensor:
        return self.norm(out)

    def forward(self, features, tokens, positions, mask, target, cache=None):
        """features: the target's fused feature [B, q, 3H] (committed positions) or the head's own
        previous output [B, q, H] (drafted positions, training-time test); tokens [B, q] (x_{t+1}),
        positions [B, q] (t) -> h_{t+1} [B, q, H], before the norm (``readout``)."""
        width = features.shape[-1]
        if width == self.fuse.in_features:
            features = self.fuse(features)
        elif width != self.fuse.out_features:
            raise ValueError(f"features of size {width}: expected the fused {self.fuse.in_features} or the "
                             f"head's own {self.fuse.out_features}")
        layer = self.layer
        emb = layer.input_layernorm(decoder.embed(target, tokens).to(features.dtype))
        if self.norm_before_residual:
            g = residual = self.hidden_norm(features)
        else:
            residual, g = features, self.hidden_norm(features)
        rope = decoder.rotary(target, features, positions)
        attn, _ = layer.self_attn(hidden_states=torch.cat([emb, g], dim=-1), position_embeddings=rope,
                                  attention_mask=mask, past_key_values=cache, position_ids=positions)
        r = residual + attn
        return r + layer.mlp(layer.post_attention_layernorm(r))


def widen_attention_input(layer: torch.nn.Module, hidden_size: int) -> torch.nn.Module:
    """EAGLE-3's layer from a copy of a target layer: q, k and v read [token, feature] (2H), each
    half starting as the copied projection, so the untrained head sums what the two halves see."""
    attn = layer.self_attn
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attn, name)
        new = torch.nn.Linear(2 * hidden_size, old.out_features, bias=old.bias is not None,
                              device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(torch.cat([old.weight, old.weight], dim=1))
            if old.bias is not None:
                new.bias.copy_(old.bias)
        setattr(attn, name, new)
    return layer


def build_eagle_head(target, features: str = "final", feature_layers=None, draft_vocab=None) -> EagleHead:
    """A head initialised from the target: layer = a copy of its last layer, norm = a copy of its final
    norm, fc = [I | I] (feature plus token embedding, the residual stream's two ingredients) with zero
    bias, so even the untrained head passes both inputs through.

    features="fused": EAGLE-3's :class:`FusedEagleHead` on ``feature_layers`` (default
    :func:`eagle3_layers`), drafting over ``draft_vocab`` (LongTensor of ids, None: all); its fuse
    starts by passing the highest of them through (g_t = high_t), the closest to what the copied
    last layer reads, and the layer's q, k and v read token and feature side by side
    (:func:`widen_attention_input`)."""
    decoder.require_llama_style(target, "EAGLE")
    if features not in ("final", "fused"):
        raise ValueError(f"features must be 'final' (EAGLE-1) or 'fused' (EAGLE-3), got {features!r}")
    n = decoder.num_layers(target)
    H = target.config.hidden_size
    param = next(target.parameters())
    layer, norm = decoder.copy_layer(target, n - 1), decoder.copy_final_norm(target)
    if features == "final":
        if feature_layers is not None or draft_vocab is not None:
            raise ValueError("feature_layers and draft_vocab belong to the fused head (features='fused'); "
                             "an EAGLE-1 head's draft vocabulary is the proposer's draft_vocab")
        head = EagleHead(layer, norm, H)
        with torch.no_grad():
            eye = torch.eye(H)
            head.fc.weight.copy_(torch.cat([eye, eye], dim=1))
            head.fc.bias.zero_()
    else:
        head = FusedEagleHead(widen_attention_input(layer, H), norm, H,
                              eagle3_layers(n) if feature_layers is None else feature_layers, draft_vocab)
        with torch.no_grad():
            head.fuse.weight.zero_()
            head.fuse.weight[:, -H:] = torch.eye(H)
    return head.to(device=param.device, dtype=param.dtype).eval()


def save_eagle(head: EagleHead, path=EAGLE_WEIGHTS, meta: dict | None = None):
    """The head's own weights (fc, layer, norm; a fused head also its fuse and draft ids) in bf16
    (ids as integers), with ``meta`` as safetensors metadata and what the loader needs to rebuild it."""
    meta = {**(meta or {}), "format": "eagle-head-v1"}
    if head.features == "fused":
        meta.update(format=EAGLE3_FORMAT, features="fused", feature_layers=json.dumps(list(head.feature_layers)),
                    draft_vocab_size=0 if head.draft_ids is None else int(head.draft_ids.numel()),
                    norm_before_residual=json.dumps(head.norm_before_residual))
    return save_weights(head.state_dict(), path, meta)


def load_eagle_weights(target, path) -> EagleHead:
    """A head for ``target`` with the weights in ``path`` (any target shape; no embedded check): an
    EAGLE-1 head, or the fused head its metadata describes (layers, draft vocabulary)."""
    param = next(target.parameters())
    state = load_weights(path, param)
    meta = weights_metadata(path)
    if meta.get("format") == "eagle3-head-v1":
        raise ValueError(f"{path} holds a fused head of the earlier layout (a linear fuse of token and feature "
                         "before a standard layer); EAGLE-3's layer reads them side by side: train it again")
    if meta.get("format") == EAGLE3_FORMAT:
        head = build_eagle_head(target, "fused", json.loads(meta["feature_layers"]), state.get("draft_ids"))
        head.norm_before_residual = json.loads(meta.get("norm_before_residual", "false"))
    else:
        head = build_eagle_head(target)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"{path} does not fit the EAGLE head: missing={missing} unexpected={unexpected}")
    return head.to(param.device).eval().requires_grad_(False)


def load_eagle_head(target, path=EAGLE_WEIGHTS) -> EagleHead:
    """The shipped, trained head for the embedded target (on the target's device and dtype)."""
    require_embedded(target, "EAGLE head")
    return load_eagle_weights(target, require_file(path, "eagle"))


def eagle_metadata(path=EAGLE_WEIGHTS) -> dict:
    return weights_metadata(path)


class EagleProposer(Proposer):
    """Drafts with an :class:`EagleHead` on the target's features.

    Chain mode (``tree=False``): ``k`` tokens, greedy or sampled (q returned).
    Tree mode (``tree=True``): EAGLE-2's dynamic tree of at most ``k`` nodes, ``depth`` levels,
    expanding the ``beam`` best nodes of each level with their ``branch`` best children; probs=None.
    draft_vocab: optional LongTensor of ids; the head's lm_head is restricted to them (vocab.py).
    None: the head's own (a fused head's trained draft vocabulary; the full one for EAGLE-1).
    draft_sampling (base.DRAFT_SAMPLING): chain "sample" (default) or "greedy"; a tree is always "greedy".
    """

    name = "eagle"
    needs_hidden_states = True

    def __init__(self, target, head: EagleHead, k: int = 4, tree: bool = False, depth: int = 5, beam: int = 4,
                 branch: int = 4, draft_vocab=None, draft_sampling: str | None = None):
        super().__init__(k)
        self.draft_sampling = resolve_draft_sampling(draft_sampling, "greedy" if tree else "sample", not tree,
                                                     "EAGLE's tree")
        for name, v in (("depth", depth), ("beam", beam), ("branch", branch)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.target = target
        self.head = head
        self.tree = bool(tree)
        self.depth, self.beam, self.branch = depth, beam, branch
        self.vocab = VocabHead(target.get_output_embeddings().weight,
                               head.draft_ids if draft_vocab is None else draft_vocab)
        self.head_cache = None
        self._last = None  # the head's output at position N-2: f̂_{N-1}, whose lm_head gives x_N

    def check_compatible(self, target) -> None:
        require_same_target(self.target, target, "an EagleProposer reads the features and shares the embeddings "
                            "of the target it was built for; pass that same model to generate()")

    @property
    def _device(self):
        return next(self.target.parameters()).device

    @property
    def _dtype(self):
        return next(self.head.parameters()).dtype

    # ---- the head's committed state ------------------------------------------------------------

    def _feed(self, features: torch.Tensor, tokens: list, start: int) -> None:
        """Append the real inputs of positions start.. (features [m, H] = f_t, tokens = x_{t+1}) to the
        head cache; keep the last output."""
        m = len(tokens)
        if m == 0:
            return
        if kv.cache_len(self.head_cache) != start:
            raise RuntimeError(f"EAGLE head cache holds {kv.cache_len(self.head_cache)} positions, expected {start}")
        dev = self._device
        pos = torch.arange(start, start + m, device=dev)[None]
        mask = causal_additive_mask(m, start, self._dtype, dev) if m > 1 else None
        out = self.head(features[None].to(self._dtype), torch.tensor([tokens], device=dev), pos, mask,
                        self.target, self.head_cache)
        self._last = out[0, -1]

    def begin(self, state: DecodeState) -> None:
        if state.prompt_hidden_states is None:
            raise RuntimeError("EagleProposer needs the prompt's hidden states (needs_hidden_states)")
        self.head_cache = kv.new_cache()
        f = self.head.target_features(state.prompt_hidden_states)  # [P, F]: features of positions 0..N-2
        n = len(state.token_list)
        self._feed(f[: n - 1], state.token_list[1:n], 0)

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        # Drafted entries used predicted features: drop them, then feed the emitted tokens with the
        # real features of the root and the accepted path.
        m = len(outcome.emitted)
        before = len(state.token_list) - m  # committed tokens before this step
        kv.crop_to(self.head_cache, before - 1)
        if m == 0:
            return
        if outcome.hidden_states is None:
            raise RuntimeError("EagleProposer needs the target's hidden states in on_verified")
        f = self.head.target_features(outcome.hidden_states)[:m]
        self._feed(f, state.token_list[before: before + m], before - 1)

    # ---- drafting -------------------------------------------------------------------------------

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from head outputs [..., H]."""
        return self.vocab.logits(self.head.readout(out))

    def _step(self, features: torch.Tensor, tokens: list, positions: torch.Tensor, mask) -> torch.Tensor:
        """Head forward of drafted inputs (its own outputs [q, H], tokens [q]) into the head cache -> [q, H]."""
        t = torch.tensor([tokens], dtype=torch.long, device=self._device)
        return self.head(features[None], t, positions, mask, self.target, self.head_cache)[0]

    def propose(self, state: DecodeState) -> Draft:
        if self.head_cache is None or self._last is None:
            raise RuntimeError("propose() before begin()")
        n = len(state.token_list)
        committed = kv.cache_len(self.head_cache)
        if committed != n - 1:
            raise RuntimeError(f"EAGLE head cache holds {committed} positions for {n} committed tokens")
        try:
            return self._propose_tree(n) if self.tree else self._propose_chain(state, n)
        finally:
            kv.crop_to(self.head_cache, committed)  # the drafted entries are never kept

    def _propose_chain(self, state: DecodeState, n: int) -> Draft:
        out = self._last

        def advance(tok: int, i: int) -> torch.Tensor:
            nonlocal out  # input [f̂_{N-1+i}, emb(d_{i+1})] at position N-1+i gives f̂_{N+i}
            out = self._step(out[None], [tok], torch.tensor([[n - 1 + i]], device=self._device), None)[0]
            return self._logits(out)

        return draft_chain(self.k, self._logits(out), advance, state, self._device, self.vocab,
                           draft_sampling=self.draft_sampling)

    def _top_children(self, out: torch.Tensor):
        """log-probabilities and token ids of the ``branch`` best children, from features [q, H]."""
        logp = torch.log_softmax(self._logits(out).float(), dim=-1).clamp_max(0.0)
        v, i = logp.topk(min(self.branch, logp.shape[-1]), dim=-1)
        return v, self.vocab.to_token(i)

    def _level_mask(self, hpar: list, past: int):
        """Mask and positions of the head's drafted tree ``hpar`` (parents of the expanded nodes' cache
        entries) over its cache: ``past`` committed entries, the root's entry (position N-2, whose input
        token is the root x_{N-1}), then the tree's entries. This is exactly the layout the target's
        tree forward has, so trees.py's mask and depth-based positions apply unchanged; a level keeps
        the rows of its new entries."""
        return (tree_attention_mask(hpar, past, dtype=self._dtype, device=self._device),
                trees.tree_position_ids(hpar, past, device=self._device))

    def _propose_tree(self, n: int) -> Draft:
        """EAGLE-2's dynamic tree (see the module docstring)."""
        # Candidate nodes, in creation order (parents first): token, parent (-1 = root), cumulative
        # log-probability, depth. ``feat`` holds the head output of every *expanded* node, ``slot``
        # its entry in the head's tree (the drafted part of the head cache), whose parents are ``hpar``.
        tok, par, score, depth = [], [], [], []
        feat, slot, hpar = {}, {}, []
        v, ids = self._top_children(self._last[None])
        for lp, t in zip(v[0].tolist(), ids[0].tolist()):
            tok.append(t), par.append(trees.ROOT), score.append(lp), depth.append(1)
        level = list(range(len(tok)))
        past = n - 2  # head cache positions before the root's entry (position N-2, input token x_{N-1})
        # A node at depth d has d - 1 ancestors, each scoring at least as high and ranking before it,
        # so with k nodes kept nothing deeper than k survives: levels past k would be drafted for nothing.
        for d in range(1, min(self.depth, self.k)):
            expand = sorted(level, key=lambda i: (-score[i], i))[: self.beam]
            # Head entries for the expanded nodes: input [feature of the parent, emb(node token)].
            start = len(hpar)
            for i in expand:
                slot[i] = len(hpar)
                hpar.append(-1 if par[i] < 0 else slot[par[i]])
            mask, pos = self._level_mask(hpar, past)
            mask, pos = mask[:, :, 1 + start:], pos[:, 1 + start:]
            f_in = torch.stack([self._last if par[i] < 0 else feat[par[i]] for i in expand])
            out = self._step(f_in, [tok[i] for i in expand], pos, mask)
            v, ids = self._top_children(out)
            level = []
            for row, i in enumerate(expand):
                feat[i] = out[row]
                for lp, t in zip(v[row].tolist(), ids[row].tolist()):
                    level.append(len(tok))
                    tok.append(t), par.append(i), score.append(score[i] + lp), depth.append(d + 1)
        # Keep the k best by cumulative score; ties go to the shallower (earlier) node, so a parent
        # (score >= child's, as log-probabilities are <= 0) always ranks before its children.
        order = sorted(range(len(tok)), key=lambda i: (-score[i], depth[i], i))
        kept, keep_set = [], set()
        for i in order:
            if len(kept) == self.k:
                break
            if par[i] < 0 or par[i] in keep_set:
                kept.append(i)
                keep_set.add(i)
        kept.sort()  # creation order is topological
        new_index = {old: j for j, old in enumerate(kept)}
        parents = torch.tensor([-1 if par[i] < 0 else new_index[par[i]] for i in kept], dtype=torch.long)
        tokens = torch.tensor([tok[i] for i in kept], dtype=torch.long, device=self._device)
        self.last_tree_scores = torch.tensor([score[i] for i in kept])  # for notebooks / tests
        return Draft(tokens, None, parents)

    def __repr__(self) -> str:
        shape = f", tree=(depth={self.depth}, beam={self.beam}, branch={self.branch})" if self.tree else ""
        fused = f", fused={self.head.feature_layers}" if self.head.features == "fused" else ""
        return with_sizing(self, f"EagleProposer(k={self.k}{shape}{fused}, draft_vocab={self.vocab.size})")


def load_eagle_proposer(target, k: int | None = None, tree: bool = False, reduced_vocab: bool = True,
                        path=EAGLE_WEIGHTS, **kwargs) -> EagleProposer:
    """The shipped EAGLE head on the embedded target (``path=EAGLE3_WEIGHTS``: the fused one). Chain
    (default k = 4) or tree (``tree=True``: default k = 16 nodes, depth 5, beam 4, branch 4).
    reduced_vocab drafts among the shipped 8,192 most frequent answer tokens, or for a head trained
    on a draft vocabulary of its own, among those; False: the full vocabulary."""
    head = load_eagle_head(target, path)
    if k is None:
        k = 16 if tree else 4
    if head.draft_ids is not None:
        vocab = None if reduced_vocab else torch.arange(target.config.vocab_size)
    else:
        vocab = shipped_vocab(reduced_vocab)
    return EagleProposer(target, head, k=k, tree=tree, draft_vocab=vocab, **kwargs)
