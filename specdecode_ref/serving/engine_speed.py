"""Engine speed, one request at a time: our engine against vLLM on the same prompts, in the same run.

Plain decoding in both engines, then each engine's speculative methods (ours: any of the
benchmark's methods, n-gram and the trained drafters; vLLM: its n-gram proposer, the one that runs
on CPU without extra weights). Each engine decodes every prompt alone (vLLM: load 1 of
``vllm_runner.run_vllm_sweep``, its start-up not timed), so the rate is what one user sees:
generated tokens over wall time, prefill included.

    python -m specdecode_ref.serving.engine_speed --per-category 2 --max-new-tokens 64 --methods plain,ngram,hydra

Where our per-token time goes, and what a static cache and ``torch.compile`` change, is
``measure.engine_profile``. Timings mean something only on a quiet machine.
"""
from __future__ import annotations

import argparse
import sys


def compare_one_at_a_time(model, tokenizer, workloads: dict, methods=("plain", "ngram"), max_new_tokens: int = 64,
                          vllm_k: int = 4, vllm_dir=None, dtype: str = "bf16", progress: bool = True,
                          eager_model=None):
    """Rates of our methods (``measure.harness.bench`` names) and of vLLM plain and n-gram (k = vllm_k) on
    the prompts of ``workloads`` (``load_workloads``). Returns a pandas DataFrame: engine, method,
    tokens, seconds, tok_per_s, vs_our_plain, vs_vllm_plain (NaN without vLLM), and the reason
    vLLM did not run in ``df.attrs["vllm"]`` (its version when it did). ``eager_model``: the same
    model on the eager backend (backend.py); its plain decoding is added as engine "ours (eager)"."""
    import pandas as pd

    from ..measure.harness import bench
    from ..models import EMBEDDED, cache_dir, chat_ids
    from . import vllm_runner

    methods = list(methods)
    if "plain" not in methods:
        methods = ["plain"] + methods
    df = bench.run_benchmark(model, tokenizer, methods, workloads, max_new_tokens, progress=progress)
    rows = []
    for m, g in df.groupby("method", sort=False):
        rows.append({"engine": "ours", "method": m, "tokens": int(g.tokens.sum()), "seconds": float(g.seconds.sum())})
    if eager_model is not None:
        g = bench.run_benchmark(eager_model, tokenizer, ["plain"], workloads, max_new_tokens, progress=progress)
        rows.append({"engine": "ours (eager)", "method": "plain", "tokens": int(g.tokens.sum()),
                     "seconds": float(g.seconds.sum())})
    ok, why = vllm_runner.vllm_available()
    if ok:
        prompts = [chat_ids(tokenizer, item["messages"]) for items in workloads.values() for item in items]
        model_dir = vllm_dir or cache_dir() / EMBEDDED
        for name, spec in (("plain", None), (f"ngram (k={vllm_k})", vllm_runner.ngram_config(k=vllm_k))):
            r = vllm_runner.run_vllm_sweep(model_dir, prompts, loads=(1,), max_tokens=max_new_tokens,
                                           speculative_config=spec, dtype=dtype).iloc[0]
            tokens = sum(len(o) for o in r.outputs)
            rows.append({"engine": "vLLM", "method": name, "tokens": tokens,
                         "seconds": tokens / float(r.throughput_tok_s)})
    out = pd.DataFrame(rows)
    out["tok_per_s"] = out.tokens / out.seconds
    ours_plain = out[(out.engine == "ours") & (out.method == "plain")].tok_per_s.iloc[0]
    out["vs_our_plain"] = out.tok_per_s / ours_plain
    theirs = out[(out.engine == "vLLM") & (out.method == "plain")].tok_per_s
    out["vs_vllm_plain"] = out.tok_per_s / theirs.iloc[0] if len(theirs) else float("nan")
    out.attrs["vllm"] = why
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="plain,ngram,hydra", help="our methods (measure.harness.bench names)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--vllm-k", type=int, default=4)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--with-eager", action="store_true",
                    help="also time our plain decoding on the eager backend (the default is the fast one where it runs)")
    args = ap.parse_args(argv)
    from ..measure.harness.timing import start_timed_cli
    from ..measure.harness.workloads import load_workloads
    from ..models import load_model

    start_timed_cli(args.threads)
    model, tok = load_model(dtype=args.dtype)
    eager = load_model(dtype=args.dtype, backend="eager")[0] if args.with_eager else None
    table = compare_one_at_a_time(model, tok, load_workloads(per_category=args.per_category),
                                  [m.strip() for m in args.methods.split(",")], args.max_new_tokens, args.vllm_k,
                                  dtype=args.dtype, eager_model=eager)
    print(table.round(3).to_string(index=False))
    print(f"vLLM: {table.attrs['vllm']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
