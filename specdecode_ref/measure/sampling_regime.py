"""The sampling regime: should a drafter sample its draft from q, or propose its argmax?

At temperature T > 0 the target samples from p (processed with the request's SamplingParams), and
verification is rejection sampling: a draft token x reported with probability q(x) is accepted with
probability min(1, p(x)/q(x)); after a rejection the token comes from the residual max(p - q, 0).
The output follows p for ANY q, provided q is the distribution x was really drawn from. A drafter
can therefore run in two lossless regimes (``proposers.DRAFT_SAMPLING``):

* **"sample"**: draw x ~ q (the drafter's own distribution, processed like the target's) and
  report q. Expected acceptance per token: sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x))
  = 1 - TV(p, q)  (``analysis.acceptance_with_q``).
* **"greedy"**: propose the drafter's argmax a* and report no q: q is one-hot on a*, so the test
  is "accept with probability p(a*)" and a rejection draws from p with a* removed. Expected
  acceptance: p(a*)  (``analysis.acceptance_one_hot``). This is what vLLM does: its EAGLE proposer
  takes ``logits.argmax(dim=-1)`` (``vllm/v1/spec_decode/eagle.py``), the model runner hands
  ``None`` as draft_probs to the rejection sampler (``vllm/v1/worker/gpu_model_runner.py``), and
  the sampler's kernels then use draft probability 1 (``vllm/v1/sample/rejection_sampler.py``).

Which accepts more depends on how peaked p and q are. As T -> 0 both p and q collapse onto their
argmaxes and both numbers become [argmax q == argmax p]: the regimes coincide (at T = 0 they are
the same run). When p is peaked (a confident target), p(a*) is close to 1 whenever the drafter
agrees on the top token, and sampling from a flatter q only adds misses: greedy wins. As T grows
p flattens, p(a*) falls towards max_x p(x), while 1 - TV(p, q) stays high if q tracks p (a
drafter distilled on the target's distribution): sampling wins. A drafter that is right about the
top token but wrong about the tail favours greedy at every T. Deterministic drafters (n-gram
copies, Medusa and EAGLE-2 trees of top-k candidates) have no q to sample: they always run the
one-hot regime (trees with the multi-candidate rule of ``verify.tree_rejection_sample``).

:func:`run_sampling_regime` measures both regimes for every drafter at T in (0, 0.7, 1.0) with
top-p 0.95 on the benchmark prompts, and reports per drafter, temperature and regime:

* ``α``: accepted / tried draft positions (``analysis.estimate_alpha``; chain drafters only);
* ``α predicted``: the mean of the formula above over the same tried positions, computed from the
  target's p and the drafter's reported q at every step (:class:`AcceptanceProbe`); ``z`` is
  (accepted - predicted) / sd, which should be a standard normal draw if the theory holds;
* ``acceptance rate`` (accepted / drafted, vLLM's) and ``τ`` (tokens per verification step);
* with ``timing=True``: tokens/s and the speedup over plain decoding, from ``compare.method_table``.

    python -m specdecode_ref.measure.sampling_regime --quick      # 1 prompt per category, 32 tokens
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import torch

from ..analysis import acceptance_one_hot, acceptance_with_q, estimate_alpha
from ..metrics import merge_stats
from ..proposers import DRAFT_SAMPLING, Draft, Proposer, load_proposer
from ..proposers.base import DecodeState, ProposerWrapper, StepOutcome
from ..sampling import GREEDY, SamplingParams, logits_to_probs
from .harness.compare import PLAIN, method_table, run_interleaved

DRAFTERS = ("ngram", "draft", "early-exit", "medusa-chain", "medusa", "eagle", "eagle-tree")
TEMPERATURES = (0.0, 0.7, 1.0)
TOP_P = 0.95
QUICK = {"per_category": 1, "max_new_tokens": 32}


def regime_sampling(temperature: float, top_p: float = TOP_P) -> SamplingParams:
    """The request's SamplingParams at one temperature: greedy at 0, else nucleus ``top_p``."""
    return GREEDY if temperature == 0 else SamplingParams(temperature=float(temperature), top_p=float(top_p))


@dataclass
class AcceptanceRecord:
    """One request's chain-draft counters: tried positions (all accepted ones plus the first
    rejected one of each step), accepted ones, and the theory's expected count and variance."""

    tried: int = 0
    accepted: int = 0
    predicted: float = 0.0
    variance: float = 0.0
    tree_steps: int = 0

    def add(self, other: "AcceptanceRecord") -> "AcceptanceRecord":
        return AcceptanceRecord(self.tried + other.tried, self.accepted + other.accepted,
                                self.predicted + other.predicted, self.variance + other.variance,
                                self.tree_steps + other.tree_steps)

    @property
    def alpha_predicted(self) -> float:
        return self.predicted / self.tried if self.tried else float("nan")

    @property
    def z(self) -> float:
        """(accepted - predicted) / sd: about N(0, 1) when every step's acceptance chance is the
        predicted one (a sum of independent-given-the-past Bernoulli trials)."""
        diff = self.accepted - self.predicted
        if self.variance > 0:
            return diff / math.sqrt(self.variance)
        return 0.0 if abs(diff) < 1e-6 else math.copysign(math.inf, diff)


class AcceptanceProbe(ProposerWrapper):
    """Wraps a drafter and, after every chain step, adds the theory's acceptance probability of
    each tried position: sum_x min(p, q) when the draft reports q, p(x) for a token reported
    one-hot. p is the target's processed distribution at that position, read from the
    verification forward itself (the hidden states the engine hands back, through the lm_head, or
    the logits of a proposer's own ``score``): no extra target forward.

    Everything else is the wrapped drafter's (``ProposerWrapper``), ``k`` included, so the probe
    may wrap an adaptive-K controller or be wrapped by one. Tree steps are counted but not
    predicted (several candidates per position). ``records`` holds one :class:`AcceptanceRecord`
    per request. predict=False only counts (no hidden states asked).
    """

    def __init__(self, proposer: Proposer, predict: bool = True):
        super().__init__(proposer)
        self.predict = bool(predict)
        self.records: list = []
        self._logits = None

    @property
    def needs_hidden_states(self) -> bool:
        return self.predict or self.proposer.needs_hidden_states

    def begin(self, state: DecodeState) -> None:
        self.records.append(AcceptanceRecord())
        super().begin(state)

    def propose(self, state: DecodeState) -> Draft:
        self._logits = None
        return super().propose(state)

    def score(self, state: DecodeState, ids: list) -> torch.Tensor:
        self._logits = super().score(state, ids)
        return self._logits

    def on_verified(self, state: DecodeState, outcome: StepOutcome) -> None:
        super().on_verified(state, outcome)
        draft, record = outcome.draft, self.records[-1]
        n = len(draft)
        if n == 0:
            return
        if draft.is_tree:
            record.tree_steps += 1
            return
        tried = min(outcome.num_accepted + 1, n)  # positions 0..num_accepted were tested
        record.tried += tried
        record.accepted += outcome.num_accepted
        if not self.predict:
            return
        if self._logits is not None:
            logits = self._logits[:tried]
        elif outcome.hidden_states is not None:  # rows: the root, then the accepted drafts
            logits = state.target.get_output_embeddings()(outcome.hidden_states[-1][:tried])
        else:
            raise RuntimeError("AcceptanceProbe got neither the verification logits nor hidden states")
        p = logits_to_probs(logits.float(), state.sampling)
        if draft.probs is None:
            pi = acceptance_one_hot(p, draft.tokens[:tried].to(p.device))
        else:
            pi = acceptance_with_q(p, draft.probs[:tried].to(p.device))
        record.predicted += float(pi.sum())
        record.variance += float((pi * (1 - pi)).sum())

    def total(self, last: int | None = None) -> AcceptanceRecord:
        """The records of the last ``last`` requests (all when None), summed."""
        out = AcceptanceRecord()
        for r in self.records[-last:] if last else self.records:
            out = out.add(r)
        return out


def _build(name: str, model, k, draft_sampling: str) -> Proposer:
    return load_proposer(name, model, k=k, draft_sampling=draft_sampling)


def _workload_prompts(tokenizer, device, per_category, categories) -> list:
    from ..models import chat_ids
    from .harness.workloads import load_workloads

    if tokenizer is None:
        raise ValueError("pass a tokenizer (to chat-template the benchmark prompts) or prompts=")
    workloads = load_workloads(categories, per_category=per_category)
    return [chat_ids(tokenizer, p["messages"], device=device) for items in workloads.values() for p in items]


def run_sampling_regime(model, tokenizer=None, drafters=DRAFTERS, temperatures=TEMPERATURES, top_p: float = TOP_P,
                        modes=DRAFT_SAMPLING, per_category: int = 2, categories=None, max_new_tokens: int = 64,
                        k: int | None = None, predict: bool = True, timing: bool = False, warmup: int = 1,
                        seed: int = 0, prompts=None, build=None, progress: bool = False):
    """α, predicted α and τ (and, with timing, tokens/s and speedup over plain decoding) for every
    drafter x temperature x drafting regime, as a pandas DataFrame (one row each).

    drafters: names for ``load_proposer`` (default: all seven families). modes: the regimes to
    try ("sample", "greedy"); a drafter that cannot sample (n-gram, trees) gets only "greedy",
    and at T = 0 every drafter runs once, labelled "greedy" (both regimes take the argmax).
    prompts: 1-D id tensors (default: the benchmark's ``per_category`` first prompts of each
    workload category, chat-templated with ``tokenizer``). build(name, model, k, draft_sampling)
    -> Proposer replaces ``load_proposer`` (tests use tiny drafters); it may raise ValueError for
    a regime the drafter does not have. predict: wrap each drafter in an :class:`AcceptanceProbe`
    (it adds a little work per step: leave it off for timing). timing: add plain decoding and the
    speed columns (compare.method_table); compare them only within one run of this function.
    """
    import pandas as pd

    device = next(model.parameters()).device
    prompts = (_workload_prompts(tokenizer, device, per_category, categories) if prompts is None
               else [torch.as_tensor(p, dtype=torch.long, device=device).reshape(-1) for p in prompts])
    if not prompts:
        raise ValueError("no prompts")
    unknown = [m for m in modes if m not in DRAFT_SAMPLING]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty subset of {DRAFT_SAMPLING}, got {modes!r}")
    build = _build if build is None else build
    rows = []
    for temperature in temperatures:
        sampling = regime_sampling(temperature, top_p)
        runs = {}  # method name -> (drafter, mode, probe)
        for name in drafters:
            for mode in (["greedy"] if sampling.is_greedy else list(modes)):
                try:
                    proposer = build(name, model, k, mode)
                except ValueError:
                    if mode == "greedy":  # every drafter has the one-hot regime: a real error
                        raise
                    continue  # a deterministic drafter has no "sample" regime
                runs[f"{name} [{mode}]"] = (name, mode, AcceptanceProbe(proposer, predict=predict))
        methods = {method: probe for method, (_, _, probe) in runs.items()}
        if timing:
            methods[PLAIN] = None
        if progress:
            print(f"T={temperature}: {len(runs)} runs x {len(prompts)} prompts", file=sys.stderr, flush=True)
        results = run_interleaved(model, prompts, methods, max_new_tokens=max_new_tokens,
                                  warmup=warmup if timing else 0, sampling=sampling, seed=seed)
        table = method_table(results, reference=PLAIN if timing else next(iter(methods)))
        for method, (name, mode, probe) in runs.items():
            stats = merge_stats(r.stats for r in results[method])
            record = probe.total(last=len(prompts))
            chain = record.tree_steps == 0 and stats.drafting_steps > 0
            row = {"drafter": name, "temperature": float(temperature), "top_p": 1.0 if sampling.is_greedy else top_p,
                   "draft_sampling": mode, "prompts": len(prompts), "tokens": stats.new_tokens,
                   "α": estimate_alpha(stats.accepted_lengths, stats.draft_lengths) if chain else float("nan"),
                   "α predicted": record.alpha_predicted if chain and predict else float("nan"),
                   "z": record.z if chain and predict else float("nan"),
                   "acceptance rate": table.loc[method, "acceptance rate"], "τ": table.loc[method, "τ"]}
            if timing:
                row["tokens/s"] = table.loc[method, "tokens/s"]
                row["speedup"] = table.loc[method, "speedup"]
            rows.append(row)
    return pd.DataFrame(rows)


def format_regime_table(df) -> str:
    """The table as aligned text (floats to 3 places)."""
    return df.to_string(index=False, float_format=lambda x: f"{x:.3f}")


def plot_sampling_regime(df, metric: str = "τ", ax=None, path=None):
    """Grouped bars: one group per drafter, one bar per (temperature, regime), height ``metric``
    ("τ", "α", "acceptance rate", "speedup", ...). For "α" the predicted α is marked on each bar
    (a black tick). Returns the matplotlib Figure; saves it to ``path`` if given."""
    import numpy as np

    from .harness.bench import pyplot

    if metric not in df.columns:
        raise ValueError(f"no column {metric!r}; choose from {list(df.columns)}")
    plt = pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * df["drafter"].nunique() + 2), 3.6))
    else:
        fig = ax.figure
    drafters = list(dict.fromkeys(df["drafter"]))
    conditions = list(dict.fromkeys(zip(df["temperature"], df["draft_sampling"])))
    width = 0.8 / len(conditions)
    colours = plt.get_cmap("tab10")
    for j, (t, mode) in enumerate(conditions):
        part = df[(df["temperature"] == t) & (df["draft_sampling"] == mode)].set_index("drafter")
        x = np.arange(len(drafters)) + (j - (len(conditions) - 1) / 2) * width
        heights = [part[metric].get(d, np.nan) for d in drafters]
        ax.bar(x, heights, width, label=f"T={t:g} {mode}", color=colours(j),
               hatch="//" if mode == "greedy" and t > 0 else None, edgecolor="white")
        if metric == "α" and "α predicted" in part:
            pred = [part["α predicted"].get(d, np.nan) for d in drafters]
            ax.scatter(x, pred, marker="_", s=120, color="black", zorder=3,
                       label="predicted" if j == 0 else None)
    ax.set_xticks(np.arange(len(drafters)))
    ax.set_xticklabels(drafters, rotation=20)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by drafter, temperature and drafting regime (sample q vs greedy one-hot)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdecode_ref.measure.sampling_regime",
        description="Acceptance of every drafter at T = 0, 0.7, 1.0 (top-p 0.95), drafting from q vs greedy one-hot.")
    p.add_argument("--quick", action="store_true",
                   help=f"a small run: {QUICK['per_category']} prompt per category, {QUICK['max_new_tokens']} new tokens")
    p.add_argument("--drafters", default=",".join(DRAFTERS), help="comma-separated (default: %(default)s)")
    p.add_argument("--temperatures", default=",".join(f"{t:g}" for t in TEMPERATURES), help="default: %(default)s")
    p.add_argument("--top-p", type=float, default=TOP_P, help="default: %(default)s")
    p.add_argument("--modes", default=",".join(DRAFT_SAMPLING), help="default: %(default)s")
    p.add_argument("--categories", default=None, help="comma-separated workload categories (default: all)")
    p.add_argument("--per-category", type=int, default=None, help="prompts per category (default: 2; --quick: 1)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 64; --quick: 32")
    p.add_argument("--k", type=int, default=None, help="draft length / tree budget (default: each drafter's own)")
    p.add_argument("--timing", action="store_true",
                   help="add plain decoding, tokens/s and speedup (turns the predicted-α probe off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--csv", default=None, help="write the table to this CSV file")
    p.add_argument("--plot", default=None, help="save grouped bars of τ (and α next to it) to this PNG")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ..models import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    per_category = args.per_category or (QUICK["per_category"] if args.quick else 2)
    max_new = args.max_new_tokens or (QUICK["max_new_tokens"] if args.quick else 64)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    try:
        temperatures = [float(t) for t in split(args.temperatures)]
    except ValueError:
        raise SystemExit(f"error: --temperatures must be numbers, got {args.temperatures!r}") from None
    model, tokenizer = load_model(device=args.device, dtype=args.dtype)
    try:
        df = run_sampling_regime(model, tokenizer, split(args.drafters), temperatures, args.top_p,
                                 tuple(split(args.modes)), per_category, args.categories, max_new, k=args.k,
                                 predict=not args.timing, timing=args.timing, seed=args.seed, progress=True)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(format_regime_table(df))
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"saved {args.csv}")
    if args.plot:
        from .harness.bench import pyplot

        fig, axes = pyplot().subplots(1, 2, figsize=(16, 4))
        plot_sampling_regime(df, "τ", ax=axes[0])
        plot_sampling_regime(df, "α", ax=axes[1])
        fig.savefig(args.plot, dpi=120)
        print(f"saved {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
