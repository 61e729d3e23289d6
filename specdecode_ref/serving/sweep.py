"""A load sweep: the scheduler at several loads, with speculation off, on and adaptive.

A load is a concurrency level: at most that many requests run at once (vLLM's ``max_num_seqs``,
or ``vllm bench serve --max-concurrency``); all requests are submitted at step 0 (or with seeded
Poisson arrivals, ``arrival_rate`` requests per step), so TTFT includes the time spent waiting for
a place in the batch. Each (load, policy) run serves the same prompts with its own copy of the
proposer; the policies run one after another per load and repeat, so slow drifts of the machine
touch all of them alike. One row per run: throughput, TTFT and ITL percentiles, acceptance and
vLLM's counters (metrics.py).

    python -m specdecode_ref.serving.sweep --loads 1,4,16 --requests 16 --max-new-tokens 64

prints the table and writes it as CSV (``--out``). Timings mean something only on a quiet machine
(``measure.harness.timing.check_quiet``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..batch import validate_prompts
from ..engine import check_positive_int
from ..measure.harness import protocol
from ..proposers.batch import fork
from .policies import POLICIES, make_policy
from .scheduler import Scheduler, poisson_arrivals


def check_loads(loads) -> list:
    """Concurrency levels: a non-empty sequence of ints >= 1 (the offending entry named)."""
    if isinstance(loads, (str, bytes)):
        raise TypeError(f"loads must be a sequence of ints (e.g. (1, 4, 16)), got the string {loads!r}")
    loads = list(loads)
    if not loads:
        raise ValueError("loads is empty: a sweep needs at least one concurrency level")
    for i, x in enumerate(loads):
        if not isinstance(x, int) or isinstance(x, bool) or x < 1:
            raise ValueError(f"loads[{i}] must be a concurrency level of at least 1 (an int), got {x!r}")
    return loads


def _proposer(proposer, k: int):
    if proposer is None:
        from ..proposers import NgramProposer

        return NgramProposer(k=k)
    return fork(proposer)


def build_scheduler(model, prompts, policy: str, load: int, proposer=None, k: int = 4, max_new_tokens: int = 64,
                    arrival_rate: float | None = None, num_blocks: int = 512, block_size: int = 16,
                    max_num_batched_tokens: int | None = None, cost=None, seed: int = 0, check: bool = False,
                    **scheduler_kwargs) -> Scheduler:
    """The scheduler of one (load, policy) run with every prompt submitted, not yet run: what
    :func:`run_once` serves, and what :func:`run_sweep` builds for every policy before any work, so
    a setting that could never serve a prompt (a block pool too small for it) fails at once."""
    if arrival_rate is not None and (isinstance(arrival_rate, bool) or not isinstance(arrival_rate, (int, float))
                                     or not arrival_rate > 0):  # NaN fails too
        raise ValueError(f"arrival_rate must be a number > 0 (requests per step) or None, got {arrival_rate!r}")
    prop = _proposer(proposer, k)
    kwargs = {"cost": cost} if (policy == "adaptive" and cost is not None) else {}
    pol = make_policy(policy, k, **kwargs)
    longest = max(p.numel() for p in prompts) + max_new_tokens
    budget = max_num_batched_tokens or max(2048, longest)
    sched = Scheduler(model, None if policy == "off" else prop, pol, num_blocks=num_blocks, block_size=block_size,
                      max_num_batched_tokens=budget, max_num_seqs=int(load), seed=seed, check_every_step=check,
                      **scheduler_kwargs)
    arrivals = [0] * len(prompts) if arrival_rate is None else poisson_arrivals(len(prompts), arrival_rate, seed)
    for p, a in zip(prompts, arrivals):
        sched.add_request(p, max_new_tokens, a)
    return sched


def run_once(model, prompts, policy: str, load: int, proposer=None, k: int = 4, max_new_tokens: int = 64,
             **run_kwargs) -> dict:
    """Serve ``prompts`` (1-D LongTensors) at concurrency ``load`` under ``policy`` ("off", "on",
    "adaptive"); returns the metrics row (serving_metrics) with load, policy and k added.

    proposer: drafts for every request (a copy per request; default n-gram with this k).
    run_kwargs: :func:`build_scheduler`'s: arrival_rate (Poisson arrivals per step; None: all at
    step 0), num_blocks, block_size, max_num_batched_tokens, cost (T(B, n) for the adaptive policy,
    policies.roofline_cost / surface_cost; default roofline), seed, check, Scheduler's keywords.
    """
    result = build_scheduler(model, prompts, policy, load, proposer, k, max_new_tokens, **run_kwargs).run()
    row = {"load": int(load), "policy": policy, "k": k}
    row.update(result.metrics())
    row["outputs"] = result.outputs()
    return row


def check_sweep(model, prompts, loads=(1, 4, 16), policies=POLICIES, k: int = 4, max_new_tokens: int = 64,
                repeats: int = 1, proposer=None, **run_kwargs) -> tuple:
    """Every argument of :func:`run_sweep` checked before any work, the offending one (or prompt)
    named: the loads, k, repeats, every policy name, every prompt, and the scheduler of every policy
    with every prompt submitted (its settings, and a block pool that can hold each request).
    Returns (loads, policies, prompts as 1-D LongTensors)."""
    loads = check_loads(loads)
    check_positive_int(k, "k")
    check_positive_int(repeats, "repeats")
    policies = list(policies)
    if not policies:
        raise ValueError(f"policies is empty: pick some of {POLICIES}")
    for p in policies:
        make_policy(p, k)
    prompts, _ = validate_prompts(model, prompts, max_new_tokens, who="run_sweep")
    for p in policies:
        build_scheduler(model, prompts, p, max(loads), proposer, k, max_new_tokens, **run_kwargs)
    return loads, policies, prompts


def run_sweep(model, prompts, loads=(1, 4, 16), policies=POLICIES, k: int = 4, max_new_tokens: int = 64,
              repeats: int = 1, warmup: bool = True, proposer=None, keep_outputs: bool = False, **run_kwargs):
    """The scheduler at every load under every policy; returns a pandas DataFrame, one row per run
    (columns: load, policy, k, repeat, throughput_tok_s, ttft_p50_s, ttft_p99_s, itl_p50_s,
    itl_p99_s, acceptance_rate, tau, spec_decode_num_* ...; ``same_as_off``: the run's outputs
    equal the "off" run's at that load, the lossless check, greedy; ``requests_differing``: how
    many requests differ, which in bf16 can be a few: a (k+1)-token forward rounds differently
    from a 1-token one, and a near-tie between two tokens can flip). keep_outputs: also an
    ``outputs`` column, the generated token ids per prompt, to compare with another engine's)."""
    import pandas as pd

    loads, policies, prompts = check_sweep(model, prompts, loads, policies, k, max_new_tokens, repeats, proposer,
                                           **run_kwargs)  # clear errors before any work
    if warmup:  # one-time costs (allocator, kernels) stay out of every policy's first timed run
        for policy in policies:
            run_once(model, prompts[:1], policy, 1, proposer, k, min(max_new_tokens, 8), **run_kwargs)
    rows = []
    for r in range(repeats):
        for li, load in enumerate(loads):
            outputs = {}
            # measure/harness/protocol.py: the order alternates, so no policy always runs first at a load
            for policy in protocol.order_of(policies, r + li):
                row = run_once(model, prompts, policy, load, proposer, k, max_new_tokens, **run_kwargs)
                outputs[policy] = row.pop("outputs")
                row["repeat"] = r
                rows.append(row)
            reference = outputs.get("off")
            for row in rows[-len(policies):]:
                mine = outputs[row["policy"]]
                row["same_as_off"] = None if reference is None else mine == reference
                row["requests_differing"] = (None if reference is None
                                             else sum(a != b for a, b in zip(mine, reference)))
                if keep_outputs:
                    row["outputs"] = mine
    return pd.DataFrame(rows)


def summary_table(df):
    """Median over repeats per (load, policy): the columns a serving dashboard shows."""
    cols = ["throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "tpot_mean_s",
            "acceptance_rate", "tau", "mean_k", "mean_batch_size", "preemptions"]
    return df.groupby(["load", "policy"], sort=True)[cols].median().reset_index()


def _option(parse):
    """An argparse ``type``: ``parse(text)``, its ValueError / TypeError as the option's error message."""
    def convert(text):
        try:
            return parse(text)
        except (ValueError, TypeError) as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    convert.__name__ = parse.__name__
    return convert


def _ints(text: str, name: str) -> list:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated ints, got {text!r}") from None


def _positive_int(name: str):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = text  # check_positive_int names the option and shows the text
        return check_positive_int(value, name)
    return _option(parse)


def _positive_float(name: str):
    def parse(text):
        value = float(text)
        if not value > 0:  # NaN fails too
            raise ValueError(f"{name} must be > 0, got {text!r}")
        return value
    return _option(parse)


def _policy_names(text: str) -> list:
    names = [x.strip() for x in text.split(",")]
    for name in names:
        make_policy(name, 1)
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdecode_ref.serving.sweep",
                                description="Serve the benchmark prompts at several loads with speculation "
                                            "off / on / adaptive (n-gram drafting); prints a table.")
    p.add_argument("--loads", default="1,4,16", type=_option(lambda text: check_loads(_ints(text, "loads"))),
                   help="concurrency levels, comma-separated")
    p.add_argument("--policies", default=",".join(POLICIES), type=_option(_policy_names))
    p.add_argument("--requests", type=_positive_int("requests"), default=16,
                   help="prompts taken from the input-grounded pool")
    p.add_argument("--pool", default="input_grounded", choices=["input_grounded", "chat"])
    p.add_argument("--k", type=_positive_int("k"), default=4)
    p.add_argument("--max-new-tokens", type=_positive_int("max_new_tokens"), default=64)
    p.add_argument("--arrival-rate", type=_positive_float("arrival_rate"), default=None,
                   help="Poisson arrivals per step (default: all at once)")
    p.add_argument("--num-blocks", type=_positive_int("num_blocks"), default=512)
    p.add_argument("--block-size", type=_positive_int("block_size"), default=16)
    p.add_argument("--cost", default="surface", choices=["surface", "roofline"],
                   help="the adaptive policy's cost model: T(B, n) measured at the loads first, or a roofline")
    p.add_argument("--knee", type=_positive_float("knee"), default=16.0,
                   help="roofline knee (tokens), with --cost roofline")
    p.add_argument("--repeats", type=_positive_int("repeats"), default=1)
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--threads", type=_positive_int("threads"), default=None)
    p.add_argument("--out", default=None, help="CSV file for the per-run rows")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out and not Path(args.out).resolve().parent.is_dir():  # found now, not after the whole sweep
        parser.error(f"argument --out: the directory of {args.out!r} does not exist")
    import pandas as pd

    from ..measure.batch_bench import measure_cost_surface, prompt_pool
    from ..models import load_model
    from .policies import roofline_cost, surface_cost

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(dtype=args.dtype)
    pool = prompt_pool(tok, args.pool)
    prompts = [pool[i % len(pool)] for i in range(args.requests)]
    loads = args.loads
    # The settings together (the block pool against the longest prompt, the context window) are
    # checked before the cost surface is measured, and reported as a usage error.
    try:
        check_sweep(model, prompts, loads, args.policies, args.k, args.max_new_tokens, args.repeats,
                    arrival_rate=args.arrival_rate, num_blocks=args.num_blocks, block_size=args.block_size)
    except (ValueError, TypeError) as err:
        parser.error(f"{err} (with --num-blocks {args.num_blocks} --block-size {args.block_size} "
                     f"--max-new-tokens {args.max_new_tokens} --k {args.k})")
    if args.cost == "surface":
        ns = sorted({1, 2, 3, args.k + 1})
        cost = surface_cost(measure_cost_surface(model, batch_sizes=sorted(set(loads)), ns=ns, context_len=64,
                                                 repeats=2, warmup=1))
    else:
        cost = roofline_cost(args.knee)
    df = run_sweep(model, prompts, loads=loads,
                   policies=args.policies, k=args.k,
                   max_new_tokens=args.max_new_tokens, repeats=args.repeats, arrival_rate=args.arrival_rate,
                   num_blocks=args.num_blocks, block_size=args.block_size, cost=cost)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(df).round(4).to_string(index=False))
    if not df.same_as_off.dropna().all():
        print("WARNING: a policy's outputs differ from plain decoding (bf16 near-ties can do that)")
    if args.out:
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
