"""Drafts sized to the machine they run on: the best chain length K and the best tree for a cost curve.

Why: the best draft depends on two things that live in different places. The drafter fixes how
likely each drafted token is to be accepted (tau, the expected tokens per step, counts the
target's own token). The machine fixes what scoring them costs: T(n), the wall time of one
target forward scoring n tokens. While T(n) is flat (a memory-bound GPU or fast CPU kernel),
extra draft tokens are nearly free and a big tree pays; when T(n) grows in proportion to n (a
compute-bound machine, or a large batch), every drafted token must earn its own forward time
and the best draft shrinks to a short chain or to plain decoding. Sequoia (Chen et al., 2024,
"Sequoia: Scalable, Robust, and Hardware-aware Speculative Decoding") puts the two together: a
dynamic program finds the tree that maximises tau for every node budget n and depth D under a
*positional* acceptance model, and the budget and depth are then chosen by the predicted
tokens per second tau / (T(n + 1) + drafting time) on the measured curve.

Speed model (seconds, not ratios, so a drafter's own time can be added as measured):

    chain of k drafts:  tokens/s = tau(k) / (T(k + 1) + draft(k)),  tau(k) = 1 + sum_{i<=k} prod_{j<=i} a_j
    tree of n nodes:    tokens/s = tau(tree) / (T(n + 1) + draft(n, depth)),
                        tau(tree) = 1 + sum_{nodes} prod_{edges on its path} p(depth, rank)
    plain decoding:     tokens/s = 1 / T(1)

The verify forward scores the root (the last committed token) plus the k or n drafts, hence
T(k + 1) and T(n + 1). Draft cost depends on the drafter: per drafted token for a draft model,
per tree level for EAGLE-like drafters (one draft forward per depth), one forward for all
levels for Medusa-like heads (:func:`per_level_draft_cost`, :func:`per_step_draft_cost`).

What is reused: tau of a chain is ``analysis.expected_tokens_from_position_rates``; the greedy
tree and a tree's expected accepted tokens are ``proposers.medusa.derive_choices`` and
``expected_accepted`` (the shipped trees are built with them); trees are Medusa-style "choices"
(rank paths), turned into a parents array by ``trees.tree_from_choices``; the cost curve is
measured by ``measure.harness.timing.measure_cost_curve`` and cached under ``cache.cache_dir()``; the
machine is named by ``measure.harness.claims.cpu_name`` / ``machine_line`` and the backend by
``backend.backend_of``. Unlike ``analysis.as_verify_cost`` (which makes a curve monotone first),
:class:`CostCurve` uses the measured times as they are: a curve that dips is shown to the model.

This module imports neither torch nor the proposers at load time; the functions that need them
(measuring, the greedy tree, the parents conversion) import them when called.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

from .analysis import expected_tokens_from_position_rates

__all__ = ["CostCurve", "as_cost_fn", "machine_cost_curve", "cost_curve_key", "chain_speed", "best_chain",
           "ChainRow", "ChainChoice", "SizedTree", "TreeRow", "TreeChoice", "rate_table", "tree_tau",
           "optimal_tree", "greedy_tree", "best_tree", "per_level_draft_cost", "per_step_draft_cost", "choose",
           "choose_per_batch", "DraftSize", "SizeRow", "stored_draft_sizes", "size_for", "machine_draft_size", "MIN_GAIN"]


# --------------------------------------------------------------------------------------------
# The cost curve T(n).
# --------------------------------------------------------------------------------------------

def _finite_positive(x, what: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {x!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a finite number > 0 (seconds), got {x!r}")
    return v


@dataclass(frozen=True)
class CostCurve:
    """T(n): measured wall time (seconds) of one target forward scoring n new tokens, n in ``ns``.

    ns: [m] strictly increasing whole numbers starting at 1 (T(1) is plain decoding's step, the
    reference of every speedup); times_s: [m] seconds, each > 0; m >= 2. Labels say what produced
    the numbers (device, dtype, backend, machine line): a curve is only valid on its machine.
    Measured values are kept as they are, even when T(2) < T(1): the model sees the curve measured.
    """

    ns: tuple
    times_s: tuple
    device: str = ""
    dtype: str = ""
    backend: str = ""
    machine: str = ""

    def __post_init__(self):
        try:
            ns, ts = list(self.ns), list(self.times_s)
        except TypeError:
            raise ValueError("ns and times_s must be sequences (token counts and seconds)") from None
        if len(ns) != len(ts):
            raise ValueError(f"ns has {len(ns)} entries but times_s has {len(ts)}: one time per token count")
        if len(ns) < 2:
            raise ValueError(f"a cost curve needs at least two points (n = 1 and a larger n), got {len(ns)}")
        out_ns = []
        for n in ns:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer, float, np.floating)) or \
                    not float(n).is_integer():
                raise ValueError(f"ns must hold whole token counts, got {n!r}")
            out_ns.append(int(n))
        if min(out_ns) < 1:
            raise ValueError(f"ns must be >= 1 (a forward scores at least one token), got {out_ns}")
        if any(b <= a for a, b in zip(out_ns, out_ns[1:])):
            raise ValueError(f"ns must be strictly increasing (sorted, no repeats), got {out_ns}")
        if out_ns[0] != 1:
            raise ValueError(f"ns must start at 1: T(1) is plain decoding's step, the reference; got {out_ns}")
        out_ts = tuple(_finite_positive(t, f"times_s[{i}]") for i, t in enumerate(ts))
        object.__setattr__(self, "ns", tuple(out_ns))
        object.__setattr__(self, "times_s", out_ts)
        for label in ("device", "dtype", "backend", "machine"):
            object.__setattr__(self, label, str(getattr(self, label)))

    def cost(self, n) -> float:
        """T(n) in seconds for any n >= 1: linear between measured points; beyond the last point the
        last segment's slope continues it (floored at 0, since a longer forward never gets cheaper
        and a falling extrapolation would reach zero time)."""
        x = float(n)
        if not math.isfinite(x) or x < 1:
            raise ValueError(f"n must be >= 1 (tokens scored by one forward), got {n!r}")
        ns, ts = self.ns, self.times_s
        if x <= ns[-1]:
            return float(np.interp(x, ns, ts))
        slope = max(0.0, (ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))
        return float(ts[-1] + slope * (x - ns[-1]))

    __call__ = cost

    def relative(self, n) -> float:
        """T(n) / T(1): the verify cost of n - 1 drafts in units of one plain step."""
        return self.cost(n) / self.cost(1)

    def to_dict(self) -> dict:
        return {"ns": list(self.ns), "times_s": list(self.times_s), "device": self.device, "dtype": self.dtype,
                "backend": self.backend, "machine": self.machine}

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        """The inverse of :meth:`to_dict`; also reads a ``timing.measure_cost_curve`` dict (its extra
        keys are ignored, its device and dtype become labels)."""
        if not isinstance(d, dict) or "ns" not in d or "times_s" not in d:
            raise ValueError("a cost curve dict needs 'ns' and 'times_s'")
        return cls(d["ns"], d["times_s"], **{k: d.get(k, "") for k in ("device", "dtype", "backend", "machine")})


def as_cost_fn(curve) -> Callable[[int], float]:
    """T(n) as a checked function of n: a :class:`CostCurve`, a ``timing.measure_cost_curve`` dict, or
    any callable n -> seconds (e.g. one batch size's row of a cost surface, ``lambda n: T(B, n)``)."""
    if isinstance(curve, CostCurve):
        return curve.cost
    if isinstance(curve, dict):
        return CostCurve.from_dict(curve).cost
    if not callable(curve):
        raise ValueError(f"curve must be a CostCurve, a measured cost-curve dict or a function n -> seconds, "
                         f"got {type(curve).__name__}")

    def cost(n: int) -> float:
        return _finite_positive(curve(n), f"T({n})")

    return cost


# --------------------------------------------------------------------------------------------
# Measuring once per machine, model, dtype and backend; cached as JSON.
# --------------------------------------------------------------------------------------------

_CACHE_SUBDIR = Path("sizing") / "cost_curves"
_CACHE_VERSION = 1


def _cpu_flags_digest() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("flags", "features")):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    return hashlib.sha256(flags.encode()).hexdigest()[:12]
    except OSError:
        pass
    return "no-flags"


def _model_identity(model) -> tuple:
    """(name, config hash) of a Hugging Face-style model: the same name with another config (e.g. a
    truncated copy) must not share a curve."""
    config = getattr(model, "config", None)
    name = str(getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "") or type(model).__name__)
    if config is None:
        cfg = {}
    elif hasattr(config, "to_dict"):
        cfg = config.to_dict()
    else:
        cfg = dict(vars(config))
    cfg = {k: v for k, v in cfg.items() if k not in ("name_or_path", "_name_or_path", "transformers_version")}
    digest = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return name, digest


def cost_curve_key(model, ns: Sequence[int]) -> dict:
    """What a cached curve depends on: the machine (CPU model, flags and torch threads, or the CUDA
    device's name), torch's version, the model's device type, dtype, backend (backend.py), name and
    config hash, and the measured ns. Any change measures again."""
    import torch

    from .backend import backend_of
    from .measure.harness.claims import cpu_name

    p = next(model.parameters())
    if p.device.type == "cuda":
        machine = f"cuda:{torch.cuda.get_device_name(p.device)}:cuda{torch.version.cuda}"
    else:
        machine = f"cpu:{cpu_name()}:flags-{_cpu_flags_digest()}:{torch.get_num_threads()}t"
    name, cfg = _model_identity(model)
    return {"version": _CACHE_VERSION, "machine": machine, "torch": torch.__version__, "device": p.device.type,
            "dtype": str(p.dtype).replace("torch.", ""), "backend": backend_of(model), "model": name,
            "config": cfg, "ns": [int(n) for n in ns]}


def _default_measure(model, ns: Sequence[int]) -> dict:
    """``measure.harness.timing.measure_cost_curve`` at a quick setting (5 repeats, a 256-token context at most)."""
    from .measure.harness.timing import measure_cost_curve

    window = getattr(model.config, "max_position_embeddings", None) or 4096
    return measure_cost_curve(model, ns=ns, context_len=max(1, min(256, window - max(ns))), repeats=5)


def _read_cached(path: Path, key: dict):
    """The cached curve, or None when the file is missing, unreadable, for another key or invalid."""
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") != key:
            return None
        return CostCurve.from_dict(stored["curve"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def machine_cost_curve(model, ns: Iterable[int] = range(1, 17), measure: Callable | None = None,
                       cache_dir=None, refresh: bool = False) -> CostCurve:
    """This machine's T(n) for ``model`` (its device, dtype and backend), measured once and cached.

    Why cached: a sizing decision should not cost a benchmark per call, but it must be redone when
    anything T(n) depends on changes (see :func:`cost_curve_key`). ns: token counts to measure
    (must start at 1). measure(model, ns) -> a ``timing.measure_cost_curve`` dict or a CostCurve
    (default: timing.measure_cost_curve, a few seconds). cache_dir: the cache root (default
    ``cache.cache_dir()``); files go to ``<root>/sizing/cost_curves/``. refresh: measure again even
    when cached. A corrupt or mismatched cache file is measured over, not trusted.
    """
    from .measure.harness.claims import machine_line

    ns = [int(n) for n in ns]
    key = cost_curve_key(model, ns)
    if cache_dir is None:
        from .cache import cache_dir as default_root

        cache_dir = default_root()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{key['model']}-{key['device']}-{key['dtype']}-{key['backend']}").strip("-")
    path = Path(cache_dir) / _CACHE_SUBDIR / f"{slug[-80:]}-{digest}.json"
    if not refresh:
        cached = _read_cached(path, key)
        if cached is not None:
            return cached
    result = (measure or _default_measure)(model, ns)
    labels = {"device": key["device"], "dtype": key["dtype"], "backend": key["backend"],
              "machine": machine_line(model)}
    if isinstance(result, CostCurve):
        curve = dataclasses.replace(result, **{k: getattr(result, k) or v for k, v in labels.items()})
    else:
        curve = CostCurve(result["ns"], result["times_s"], **labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "curve": curve.to_dict()}, indent=1))
    os.replace(tmp, path)
    return curve


# --------------------------------------------------------------------------------------------
# Chains.
# --------------------------------------------------------------------------------------------

def _check_k(k, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"{name} must be an int >= 0, got {k!r}")
    return int(k)


def _chain_rates(rates) -> np.ndarray:
    r = np.asarray(rates, dtype=float)
    if r.ndim != 1:
        raise ValueError(f"rates must be 1-D, one conditional acceptance rate per draft position; got shape {r.shape}")
    if not np.all(np.isfinite(r)) or np.any((r < 0) | (r > 1)):
        raise ValueError("per-position acceptance rates must lie in [0, 1]")
    return r


def _chain_draft_seconds(draft_cost_s, k: int) -> float:
    if k == 0:
        return 0.0
    if callable(draft_cost_s):
        v = float(draft_cost_s(k))
    else:
        try:
            v = float(draft_cost_s) * k
        except (TypeError, ValueError):
            raise ValueError("draft_cost_s must be seconds per drafted token or a function k -> seconds") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"drafting time must be a finite number of seconds >= 0, got {v!r} for k = {k}")
    return v


class ChainRow(NamedTuple):
    k: int  # drafts per step (0: plain decoding)
    tau: float  # expected tokens per step
    step_s: float  # T(k + 1) + drafting time
    tokens_per_s: float


class ChainChoice(NamedTuple):
    k: int
    tokens_per_s: float
    table: list  # [ChainRow] for k = 0 .. k_max


def _chain_row(rates: np.ndarray, k: int, cost, draft_cost_s) -> ChainRow:
    if k > rates.size:
        raise ValueError(f"k = {k} needs {k} per-position rates, got {rates.size}")
    tau = expected_tokens_from_position_rates(rates[:k]) if k else 1.0
    step = cost(k + 1) + _chain_draft_seconds(draft_cost_s, k)
    return ChainRow(k, tau, step, tau / step)


def chain_speed(rates: Sequence[float], k: int, curve, draft_cost_s=0.0) -> float:
    """Predicted tokens per second of a chain drafter drafting k tokens per step.

    rates: [k_max] conditional acceptance rates a_1..a_kmax (a_i = P(position i accepted | 1..i-1
    were)); tau = 1 + sum_{i<=k} prod_{j<=i} a_j. curve: T(n) (CostCurve, cost dict or n -> s).
    draft_cost_s: seconds of drafting per step as a function k -> s, or a float = seconds per drafted
    token. Step time T(k + 1) + drafting; k = 0 is plain decoding, 1 / T(1).
    """
    return _chain_row(_chain_rates(rates), _check_k(k), as_cost_fn(curve), draft_cost_s).tokens_per_s


def best_chain(rates: Sequence[float], curve, draft_cost_s=0.0, k_max: int | None = None) -> ChainChoice:
    """The chain length with the highest predicted tokens per second, k in 0..k_max (0: plain
    decoding; ties go to the shorter chain). k_max defaults to len(rates). Returns (k, tokens/s,
    table of every k)."""
    r = _chain_rates(rates)
    k_max = r.size if k_max is None else _check_k(k_max, "k_max")
    cost = as_cost_fn(curve)
    table = [_chain_row(r, k, cost, draft_cost_s) for k in range(k_max + 1)]
    best = max(table, key=lambda row: (row.tokens_per_s, -row.k))
    return ChainChoice(best.k, best.tokens_per_s, table)


# --------------------------------------------------------------------------------------------
# Trees under the positional acceptance model.
# --------------------------------------------------------------------------------------------

def rate_table(rank_rates, depth: int) -> np.ndarray:
    """Per-depth, per-rank acceptance [depth, R] from ``rank_rates``: [R] (the same at every depth,
    Sequoia's positional model) or [rows, R] (row d-1 for depth d; depths past the last row reuse it).

    Entry p(d, r) = P(the rank-r child of an accepted node at depth d - 1 is accepted). At most one
    child of a node can be accepted, so a row must sum to <= 1 (cumulative top-k accuracies do not).
    """
    p = np.asarray(rank_rates, dtype=float)
    if p.ndim == 1:
        p = p[None, :]
    if p.ndim != 2 or p.shape[0] < 1 or p.shape[1] < 1:
        raise ValueError(f"rank_rates must be [R] or [depth, R] with R >= 1, got shape {np.shape(rank_rates)}")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("rank acceptance rates must lie in [0, 1]")
    sums = p.sum(axis=1)
    if np.any(sums > 1 + 1e-9):
        raise ValueError(f"a row of rank_rates sums to {sums.max():.4f} > 1: the ranks of one node are disjoint "
                         "events (at most one child is accepted); were cumulative top-k accuracies passed?")
    depth = _check_k(depth, "depth")
    rows = np.minimum(np.arange(depth), p.shape[0] - 1)
    return p[rows]


@dataclass(frozen=True)
class SizedTree:
    """A draft tree as Medusa-style choices (rank paths, e.g. ``(0, 1)`` = the second candidate under
    the first), in trees.tree_from_choices' node order (by depth, then lexicographic), with its
    expected tokens per step tau under the rate model that built it."""

    choices: tuple
    tau: float

    @property
    def n_nodes(self) -> int:
        return len(self.choices)

    @property
    def depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    def choice_tree(self):
        """trees.ChoiceTree (parents LongTensor [n], ranks [n], choices): what proposers take."""
        from .trees import tree_from_choices

        return tree_from_choices(self.choices)

    def parents(self) -> list:
        """The parents array [n] (trees.py's convention: -1 = the root) as a list of ints."""
        return self.choice_tree().parents.tolist()


def _canonical(choices) -> tuple:
    return tuple(sorted((tuple(int(x) for x in c) for c in choices), key=lambda t: (len(t), t)))


def tree_tau(rank_rates, choices) -> float:
    """tau of a tree given as choices: 1 + sum over nodes of the product of p(depth, rank) on its path
    (``medusa.expected_accepted`` on the per-depth table, plus the target's own token)."""
    from .proposers.medusa import expected_accepted

    choices = [tuple(c) for c in choices]
    depth = max((len(c) for c in choices), default=0)
    return 1.0 + float(expected_accepted(rate_table(rank_rates, depth).tolist(), choices)) if choices else 1.0


def _dp(table: np.ndarray, n_max: int):
    """Sequoia's DP. table: [D, R] (row d = children at depth d + 1). Returns (G, arg):
    G[d][k] = the best sum of path probabilities (relative to a node at depth d) of the subtree
    below a node at depth d using <= k nodes; arg[d][r][k] = nodes given to the rank-r child's
    subtree when k nodes remain for ranks r.. (0 = no rank-r child, hence no higher rank either)."""
    depth, ranks = table.shape
    size = n_max + 1
    kk = np.arange(size)[:, None]
    ss = np.arange(size)[None, :]
    valid = (ss >= 1) & (ss <= kk)
    rest_index = np.clip(kk - ss, 0, None)
    G = [None] * (depth + 1)
    arg = [None] * depth
    G[depth] = np.zeros(size)
    for d in range(depth - 1, -1, -1):
        below = G[d + 1]
        H = np.zeros(size)  # ranks >= R: no children
        arg_d = [None] * ranks
        for r in range(ranks - 1, -1, -1):
            child = np.full(size, -np.inf)
            child[1:] = table[d, r] * (1.0 + below[:-1])  # a rank-r child with s - 1 nodes below it
            m = np.where(valid, child[ss] + H[rest_index], -np.inf)
            s_best = m.argmax(axis=1)
            best = m[kk[:, 0], s_best]
            take = best > 0  # ties with stopping stop: fewer nodes for the same tau
            H = np.where(take, best, 0.0)
            arg_d[r] = np.where(take, s_best, 0)
        G[d] = H
        arg[d] = arg_d
    return G, arg


def _rebuild(arg, n: int) -> list:
    out: list = []

    def fill(d: int, prefix: tuple, k: int) -> None:
        r = 0
        while d < len(arg) and r < len(arg[d]) and k > 0:
            s = int(arg[d][r][k])
            if s == 0:
                break
            node = prefix + (r,)
            out.append(node)
            fill(d + 1, node, s - 1)
            k -= s
            r += 1

    fill(0, (), n)
    return out


def optimal_tree(rank_rates, budget: int, max_depth: int | None = None) -> SizedTree:
    """The tree of at most ``budget`` nodes and depth <= ``max_depth`` with the highest tau, by
    Sequoia's dynamic program over (nodes, depth), children of a node taking ranks 0, 1, 2, ...

    rank_rates: [R] or [depth, R] (see :func:`rate_table`). max_depth: None = no cap (= budget).
    Exact under the positional model for any rates, sorted or not (it never skips a rank).
    """
    budget = _check_k(budget, "budget")
    depth = budget if max_depth is None else min(_check_k(max_depth, "max_depth"), budget)
    table = rate_table(rank_rates, depth)
    if budget == 0 or depth == 0:
        return SizedTree((), 1.0)
    G, arg = _dp(table, budget)
    return SizedTree(_canonical(_rebuild(arg, budget)), 1.0 + float(G[0][budget]))


def greedy_tree(rank_rates, budget: int, max_depth: int | None = None) -> SizedTree:
    """The shipped trees' build (``proposers.medusa.derive_choices``): add, one at a time, the
    candidate node with the highest path probability.

    When it equals :func:`optimal_tree`: whenever every row of the rates is non-increasing in the
    rank (p(d, 0) >= p(d, 1) >= ...), with or without a depth cap and with per-depth rows too
    (checked against the DP in tests/test_sizing.py). Why: a node's value is its parent's times a
    rate <= 1, and a rank's value is at most its lower sibling's, so the n most probable nodes
    always form a valid tree (every node's parent and lower-ranked siblings are among them), and
    no tree of n nodes can beat the n best nodes. They can differ only when a row is not sorted:
    the greedy build then takes a higher rank without the lower one (fine for Medusa-style top-k
    verification, where a rank-r candidate is checked on its own), which the positional model's
    ordered children do not allow; the DP's tau is then the positional model's optimum and the
    greedy tree may score differently. Exact ties may pick different but equally good trees.
    """
    from .proposers.medusa import derive_choices

    budget = _check_k(budget, "budget")
    depth = budget if max_depth is None else min(_check_k(max_depth, "max_depth"), budget)
    table = rate_table(rank_rates, depth)
    if budget == 0 or depth == 0:
        return SizedTree((), 1.0)
    choices = derive_choices(table.tolist(), budget)
    return SizedTree(_canonical(choices), tree_tau(rank_rates, choices))


def per_level_draft_cost(seconds_per_level: float) -> Callable[[int, int], float]:
    """Drafting time of an EAGLE-like drafter: one draft forward per tree level, (n, depth) -> depth * s."""
    s = float(seconds_per_level)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"seconds_per_level must be >= 0, got {seconds_per_level!r}")
    return lambda n_nodes, depth: depth * s


def per_step_draft_cost(seconds_per_step: float) -> Callable[[int, int], float]:
    """Drafting time of Medusa-like heads: one forward gives every level, (n, depth) -> s (0 when n = 0)."""
    s = float(seconds_per_step)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"seconds_per_step must be >= 0, got {seconds_per_step!r}")
    return lambda n_nodes, depth: s if n_nodes else 0.0


class TreeRow(NamedTuple):
    budget: int  # node budget asked for (0: plain decoding)
    tree: SizedTree  # the best tree for it (may use fewer nodes or a shallower depth)
    tau: float
    step_s: float  # T(n + 1) + drafting time
    tokens_per_s: float


class TreeChoice(NamedTuple):
    budget: int
    tree: SizedTree
    tokens_per_s: float
    table: list  # [TreeRow], one per budget, with the best depth for that budget


def _tree_draft_seconds(draft_cost_s_per_depth, n: int, depth: int) -> float:
    if n == 0:
        return 0.0
    if not callable(draft_cost_s_per_depth):
        raise ValueError("draft_cost_s_per_depth must be a function (n_nodes, depth) -> seconds; "
                         "see per_level_draft_cost and per_step_draft_cost")
    v = float(draft_cost_s_per_depth(n, depth))
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"drafting time must be a finite number of seconds >= 0, got {v!r} for n={n}, depth={depth}")
    return v


def best_tree(rank_rates, curve, draft_cost_s_per_depth, budgets: Sequence[int] = range(0, 65),
              max_depth: int | None = None) -> TreeChoice:
    """The node budget and depth with the highest predicted tokens per second (Sequoia's
    hardware-aware choice): for every depth cap D <= max_depth the DP gives the best tree of each
    budget, scored tau / (T(n + 1) + draft(n, depth)) with n and depth the tree's own.

    rank_rates: [R] or [depth, R]; curve: T(n) (CostCurve, cost dict or n -> s);
    draft_cost_s_per_depth: (n_nodes, depth) -> seconds; budgets: node budgets to compare (0 =
    plain decoding, 1 / T(1)); max_depth: None = the largest budget. Ties go to the smaller budget
    and the shallower tree. Returns (budget, tree, tokens/s, table over budgets).
    """
    budgets = sorted({_check_k(b, "budget") for b in budgets})
    if not budgets:
        raise ValueError("budgets must list at least one node budget (0 = plain decoding)")
    cost = as_cost_fn(curve)
    n_max = budgets[-1]
    d_max = n_max if max_depth is None else min(_check_k(max_depth, "max_depth"), n_max)
    rate_table(rank_rates, 1)  # validate once, even when only budget 0 is asked
    plain = SizedTree((), 1.0)
    best_for = {b: None for b in budgets}
    best_for[0] = TreeRow(0, plain, 1.0, cost(1), 1.0 / cost(1))
    for d in range(1, d_max + 1):
        G, arg = _dp(rate_table(rank_rates, d), n_max)
        for b in budgets:
            if b == 0:
                continue
            tree = SizedTree(_canonical(_rebuild(arg, b)), 1.0 + float(G[0][b]))
            step = cost(tree.n_nodes + 1) + _tree_draft_seconds(draft_cost_s_per_depth, tree.n_nodes, tree.depth)
            row = TreeRow(b, tree, tree.tau, step, tree.tau / step)
            if best_for[b] is None or row.tokens_per_s > best_for[b].tokens_per_s:  # ties: the shallower
                best_for[b] = row
    table = [best_for[b] or TreeRow(b, plain, 1.0, cost(1), 1.0 / cost(1)) for b in budgets]  # max_depth = 0
    best = max(table, key=lambda row: (row.tokens_per_s, -row.budget, -row.tree.depth))
    return TreeChoice(best.budget, best.tree, best.tokens_per_s, table)


# --------------------------------------------------------------------------------------------
# One entry point, and per batch size.
# --------------------------------------------------------------------------------------------

def choose(kind: str, rates, cost_fn, draft_cost, **kwargs):
    """Size a draft for one cost curve: ``kind="chain"`` -> :func:`best_chain` (rates [k_max],
    draft_cost per token or k -> s), ``kind="tree"`` -> :func:`best_tree` (rank rates [R] or
    [depth, R], draft_cost (n, depth) -> s). cost_fn: T(n) for the batch at hand (a CostCurve, a
    cost dict, or n -> s, e.g. ``lambda n: T(B, n)``); the steeper it is, the smaller the draft."""
    if kind == "chain":
        return best_chain(rates, cost_fn, draft_cost, **kwargs)
    if kind == "tree":
        return best_tree(rates, cost_fn, draft_cost, **kwargs)
    raise ValueError(f"kind must be 'chain' or 'tree', got {kind!r}")


def choose_per_batch(kind: str, rates, batch_cost: Callable[[int, int], float], batch_sizes: Sequence[int],
                     draft_cost, draft_cost_by_batch: Callable | None = None, **kwargs) -> dict:
    """{B: choice} with T(n) = batch_cost(B, n) for each batch size B (a step of B requests each
    scoring n tokens; every request gains tau tokens, so the per-request choice is the batch's).
    draft_cost_by_batch: optional B -> draft cost spec (else ``draft_cost`` for every B)."""
    if not callable(batch_cost):
        raise ValueError("batch_cost must be a function (B, n) -> seconds")
    out = {}
    for b in batch_sizes:
        b = _check_k(b, "batch size")
        if b < 1:
            raise ValueError("batch sizes must be >= 1")
        dc = draft_cost_by_batch(b) if draft_cost_by_batch is not None else draft_cost
        out[b] = choose(kind, rates, (lambda n, b=b: batch_cost(b, n)), dc, **kwargs)
    return out


# --------------------------------------------------------------------------------------------
# The size load_proposer drafts with: each shipped drafter's measured table and this machine.
# --------------------------------------------------------------------------------------------

#: A draft must be predicted at least this much faster than plain decoding, or the drafter stands
#: aside: a smaller predicted gain is within the model's error on unseen prompts (a few per cent),
#: and standing aside cannot be slower than plain decoding.
MIN_GAIN = 0.02
SIZING_NS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 24, 32)  # up to 16 drafts, and batches
DRAFT_SIZES = Path(__file__).resolve().parent / "data" / "measured" / "draft_sizes.json"


class SizeRow(NamedTuple):
    size: int  # k of a chain or lookup, node budget of a tree
    tau: float  # tokens per decode step (measured)
    step_s: float  # predicted seconds per decode step on this machine (of the whole batch when B > 1)
    tokens_per_s: float


@dataclass(frozen=True)
class DraftSize:
    """The size chosen for one drafter on one machine, and the prediction behind it.

    size: the k (chain, lookup) or node budget (tree) with the highest predicted tokens per
    second; 0 when no size is predicted at least ``MIN_GAIN`` faster than plain decoding (the
    drafter then stands aside and drafts nothing). table: a :class:`SizeRow` per measured size. t1_s: T(1) here.
    """

    name: str
    size: int
    tokens_per_s: float
    plain_tokens_per_s: float
    table: tuple
    t1_s: float
    machine: str = ""
    batch_size: int = 1

    @property
    def speedup(self) -> float:
        """Predicted tokens per second over plain decoding's, at the chosen size (1.0 when standing aside)."""
        return self.tokens_per_s / self.plain_tokens_per_s

    @property
    def best_row(self) -> SizeRow:
        return max(self.table, key=lambda r: (r.tokens_per_s, -r.size))

    def describe(self) -> str:
        """One line: what was chosen, the predicted speed against plain decoding, and on what curve."""
        best = self.best_row
        if self.size == 0:
            return (f"drafts nothing: no size is predicted {MIN_GAIN:.0%} faster than plain decoding here "
                    f"(best size {best.size} at {best.tokens_per_s / self.plain_tokens_per_s:.2f}x, "
                    f"T(1) = {self.t1_s * 1e3:.1f} ms)")
        batch = f" at batch size {self.batch_size}" if self.batch_size > 1 else ""
        return (f"k = {self.size} chosen for this machine{batch}: predicted {self.speedup:.2f}x plain decoding "
                f"(tau {best.tau:.2f}, a step costs {best.step_s / self.t1_s:.2f} one-token forwards, "
                f"T(1) = {self.t1_s * 1e3:.1f} ms)")


def stored_draft_sizes(path=None) -> dict:
    """The table ``measure.draft_sizes`` wrote: per drafter and size, tau, verify widths and the
    drafter's and the engine's seconds per step, with the run's T(1) (``meta.t1_s``)."""
    p = Path(path) if path is not None else DRAFT_SIZES
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{p} is missing: run `python -m specdecode_ref.measure.draft_sizes`") from None


def _expected_widest(widths: dict, b: int) -> float:
    """E[the widest of b rows' verifies], each row's width drawn from ``widths`` ({n: share}): a
    batch pads every row to its longest draft, so a step of b rows scores b times that many."""
    ns = sorted(widths)
    cdf = np.cumsum([widths[n] for n in ns])
    cdf = cdf / cdf[-1]
    below = np.concatenate([[0.0], cdf[:-1]])
    return float(sum(n * (c ** b - p ** b) for n, c, p in zip(ns, cdf, below)))


def size_for(name: str, curve, table: dict | None = None, batch_size: int = 1) -> DraftSize:
    """Predict every measured size of drafter ``name`` on ``curve`` (this machine's T(n)) and keep
    the fastest, or 0 (stand aside) when none is predicted at least ``MIN_GAIN`` faster than plain
    decoding.

    A size's step: sum_n w_n T(n) over the widths its verify scores (w_n: share of steps), plus the
    drafter's and the engine's measured seconds per step, scaled by the ratio of the two machines'
    one-token forwards on their cost curves (``meta.curve_t1_s`` of the measuring machine; its
    in-engine T(1) for tables without it). Plain decoding: 1 / (T(1) + the engine's seconds per
    plain step, scaled alike). Ties go to the smaller size.

    What the scaling assumes: the drafter's and the engine's time keep their ratio to the target's
    forward. That holds between CPUs of one kind; on a GPU the engine's Python time does not shrink
    with the forward, so measure the table there (``python -m specdecode_ref.measure.draft_sizes``).
    The table's acceptance is greedy decoding's, in the dtype it was measured in.

    batch_size B > 1: a step of B requests feeds B times the rows through every weight matrix, the
    rows padded to the longest draft of the batch, so its forward is taken as T(B E[max width]) on
    the one-request curve (attention, which grows with each row's own context, aside), and the
    drafter's and the engine's time as B times one request's (an overcharge for a drafter that
    shares one forward across rows). tokens_per_s is then the batch's, B tau per step; the choice
    and the speedup over plain decoding are the same per request. The larger B, the steeper the
    curve a draft meets, and the smaller the size that pays.
    """
    table = stored_draft_sizes() if table is None else table
    drafters = table.get("drafters", {})
    if name not in drafters:
        raise ValueError(f"no measured sizes for {name!r}; the table covers {sorted(drafters)}")
    b = _check_k(batch_size, "batch_size")
    if b < 1:
        raise ValueError("batch_size must be >= 1")
    meta = table["meta"]
    cost = as_cost_fn(curve)
    t1 = cost(1)
    scale = t1 / _finite_positive(meta.get("curve_t1_s", meta["t1_s"]), "the table's T(1)")
    plain = b / (cost(b) + b * scale * float(meta.get("plain_overhead_s", 0.0)))
    rows = []
    for s, e in sorted(drafters[name]["sizes"].items(), key=lambda kv: int(kv[0])):
        widths = {int(n): float(w) for n, w in e["widths"].items()}
        if b == 1:
            forward = sum(w * cost(n) for n, w in widths.items())
        else:
            forward = cost(b * _expected_widest(widths, b))
        step = forward + b * scale * (float(e["draft_s"]) + float(e["overhead_s"]))
        rows.append(SizeRow(int(s), float(e["tau"]), step, b * float(e["tau"]) / step))
    if not rows:
        raise ValueError(f"the table holds no sizes for {name!r}")
    best = max(rows, key=lambda r: (r.tokens_per_s, -r.size))
    size = best.size if best.tokens_per_s > (1 + MIN_GAIN) * plain else 0
    return DraftSize(name, size, best.tokens_per_s if size else plain, plain, tuple(rows), t1,
                     getattr(curve, "machine", ""), b)


def machine_draft_size(name: str, model, table: dict | None = None, refresh: bool = False,
                       batch_size: int = 1) -> DraftSize:
    """:func:`size_for` on this machine's cost curve for ``model`` (:func:`machine_cost_curve`,
    measured once for n = 1..32 and cached; a wider forward continues the last slope)."""
    curve = machine_cost_curve(model, ns=SIZING_NS, refresh=refresh)
    return size_for(name, curve, table, batch_size=batch_size)
