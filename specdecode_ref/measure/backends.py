"""The two target backends side by side (backend.py): one product, the cost curve, the memory
floor, and whether they decode the same text.

* :func:`product_times`: one weight matrix times M token rows, eager ``F.linear`` against the fast
  kernel, M = 1..16: matrix-vector against matrix-matrix products.
* :func:`memory_floor`: the streaming bandwidth and the time to read every weight once.
* :func:`cost_curves`: T(n) of several models, interleaved round by round so drift hits them alike.
* :func:`row_invariant`: whether a position's logits are bitwise the same however many tokens
  share its forward.
* :func:`greedy_agreement`: plain greedy decoding on both backends, prompt by prompt: the same
  tokens?, the logit gap at the first difference, and the speed of each.
* :func:`compile_check`: ``torch.compile`` around the model on the fast backend (the kernels are torch
  operators, so they sit in its graph): the framework time it removes per forward, what compiling
  costs, whether positions stay bitwise invariant, and how far its logits move.

Run ``python -m specdecode_ref.measure.backends`` for all of them on this machine (the CPU is printed
with the figures).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import backend as _backend


@torch.inference_mode()
def product_times(weight: torch.Tensor, rows=(1, 2, 4, 8, 16), repeats: int = 9, seed: int = 0):
    """ms for ``weight`` [N, K] times M activation rows, eager ``F.linear`` and the fast kernel,
    each M measured interleaved (warm-up call first). Returns a DataFrame indexed by M with columns
    ``eager ms``, ``fast ms``, ``eager GB/s``, ``fast GB/s`` (weight bytes / time) and
    ``eager rows invariant`` / ``fast rows invariant`` (row 0 bitwise equal to row 0 alone)."""
    import pandas as pd

    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got {tuple(weight.shape)}")
    g = torch.Generator().manual_seed(seed)
    x_all = torch.randn(max(rows), weight.shape[1], generator=g).to(weight.dtype)
    eager = lambda x: F.linear(x, weight)            # noqa: E731
    fast = lambda x: _backend.linear(x, weight)      # noqa: E731
    samples = {m: {"eager": [], "fast": []} for m in rows}
    for fn in (eager, fast):
        fn(x_all[:1])
    for _ in range(repeats):
        for m in rows:
            x = x_all[:m].contiguous()
            for name, fn in (("eager", eager), ("fast", fast)):
                t0 = time.perf_counter()
                fn(x)
                samples[m][name].append(time.perf_counter() - t0)
    gb = weight.numel() * weight.element_size() / 1e9
    table = {}
    for m in rows:
        x = x_all[:m].contiguous()
        row = {}
        for name in ("eager", "fast"):
            ms = statistics.median(samples[m][name]) * 1e3
            row[f"{name} ms"] = ms
            row[f"{name} GB/s"] = gb / (ms / 1e3)
        for name, fn in (("eager", eager), ("fast", fast)):
            row[f"{name} rows invariant"] = bool(torch.equal(fn(x)[0], fn(x_all[:1])[0]))
        table[m] = row
    return pd.DataFrame(table).T.rename_axis("rows M")


def memory_floor(model, repeats: int = 5) -> dict:
    """``{"bandwidth_gbs", "weight_bytes", "floor_ms"}``: streaming bandwidth from summing a 256 MB
    buffer (a read-only sweep, as a decode step's weight traffic is), and the time to read every
    distinct parameter of ``model`` once at that rate."""
    from .harness.timing import median_time

    buf = torch.ones(64 * 2**20)
    bandwidth = buf.numel() * 4 / median_time(lambda: buf.sum(), repeats=repeats)
    del buf
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"bandwidth_gbs": bandwidth / 1e9, "weight_bytes": weight_bytes,
            "floor_ms": weight_bytes / bandwidth * 1e3}


def cost_curves(models: dict, ns=(1, 2, 3, 5, 9, 17), context_len: int = 200, rounds: int = 5,
                warmup: int = 1) -> dict:
    """T(n) for each of ``models`` ({name: model}), measured in ``rounds`` interleaved rounds (each
    a :func:`bench.measure_cost_curve` of one repeat per model in turn); the median per n is kept.
    Returns ``{name: {"ns", "times_s", "relative"}}``."""
    from .harness.bench import measure_cost_curve

    samples = {name: {n: [] for n in ns} for name in models}
    for r in range(warmup + rounds):
        for name, model in models.items():
            curve = measure_cost_curve(model, ns=ns, context_len=context_len, repeats=1, warmup=1 if r == 0 else 0)
            if r >= warmup:
                for n, t in zip(curve["ns"], curve["times_s"]):
                    samples[name][n].append(t)
    out = {}
    for name in models:
        times = [statistics.median(samples[name][n]) for n in ns]
        out[name] = {"ns": list(ns), "times_s": times, "relative": [t / times[0] for t in times]}
    return out


@torch.inference_mode()
def row_invariant(model, input_ids: torch.Tensor, prefix_len: int, max_n: int = 16) -> list:
    """For n = 1..max_n - 1: whether the logits of the first n tokens after ``prefix_len`` cached
    tokens are bitwise those of the same tokens scored in one forward of max_n. Returns a list of
    max_n - 1 bools."""
    from .. import kv

    ids = torch.as_tensor(input_ids).reshape(-1)
    if prefix_len < 1 or prefix_len + max_n > ids.numel():
        raise ValueError(f"need prefix_len >= 1 and prefix_len + max_n <= {ids.numel()} prompt tokens")

    def scored(n):
        cache = kv.new_cache(model)
        model(input_ids=ids[None, :prefix_len], past_key_values=cache, use_cache=True, logits_to_keep=1)
        return model(input_ids=ids[None, prefix_len:prefix_len + n], past_key_values=cache, use_cache=True).logits[0]

    full = scored(max_n)
    return [bool(torch.equal(scored(n), full[:n])) for n in range(1, max_n)]


@torch.inference_mode()
def _logit_gap(model, ids: torch.Tensor, tokens: list, at: int) -> float:
    """top-1 minus top-2 logit of ``model`` at new-token index ``at`` (how close the tie was)."""
    x = torch.cat([ids, torch.tensor(tokens[:at], dtype=torch.long)])[None]
    top = model(input_ids=x, logits_to_keep=1).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def greedy_agreement(fast, eager, prompts: dict, max_new_tokens: int = 64, progress: bool = True):
    """Plain greedy decoding of every prompt on both backends (interleaved per prompt).

    prompts: ``{prompt_id: 1-D ids}``. Returns a DataFrame, one row per prompt: ``same`` (identical
    tokens), ``first_diff`` (index of the first differing token, -1 if none), ``eager_gap`` /
    ``fast_gap`` (top-1 minus top-2 logit there, each backend's own), ``eager_tok_s``, ``fast_tok_s``
    (decode-phase tokens per second, prefill excluded).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ..engine import autoregressive_generate
    from .harness.timing import decode_seconds

    rows = []
    for pid, ids in tqdm(list(prompts.items()), desc="plain, both backends", disable=not progress):
        res = {name: autoregressive_generate(m, ids, max_new_tokens=max_new_tokens)
               for name, m in (("eager", eager), ("fast", fast))}
        a, b = res["eager"].tokens.tolist(), res["fast"].tokens.tolist()
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), -1)
        if diff < 0 and len(a) != len(b):
            diff = min(len(a), len(b))
        row = {"prompt_id": pid, "same": a == b, "first_diff": diff, "eager_gap": float("nan"),
               "fast_gap": float("nan")}
        if diff >= 0:
            row["eager_gap"] = _logit_gap(eager, ids, a, diff)
            row["fast_gap"] = _logit_gap(fast, ids, a, diff)
        for name, r in res.items():
            row[f"{name}_tok_s"] = len(r.tokens) / max(decode_seconds(r), 1e-9)
        rows.append(row)
    return pd.DataFrame(rows)


@torch.inference_mode()
def compile_check(model, input_ids: torch.Tensor, prefix_len: int, ns=(1, 5, 9), repeats: int = 7) -> dict:
    """T(n) of ``model`` as it is and under ``torch.compile(model.forward, dynamic=True)``, the seconds
    each first call of the compiled forward took (compilation), :func:`row_invariant` under compile,
    and the largest logit difference of a full-prompt forward compiled against not. Slow (minutes):
    every new shape class compiles. Returns a dict; ``model.forward`` is restored."""
    import statistics

    from .. import kv

    ids = torch.as_tensor(input_ids).reshape(-1)

    def t_of(forward, n: int, reps: int) -> float:
        cache = kv.new_cache(model)
        model(input_ids=ids[None, :prefix_len], past_key_values=cache, use_cache=True, logits_to_keep=1)
        times = []
        for _ in range(reps):
            kv.crop_to(cache, prefix_len)
            t0 = time.perf_counter()
            forward(input_ids=ids[None, prefix_len:prefix_len + n], past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    plain = model.forward
    before = {n: t_of(plain, n, repeats) for n in ns}
    compiled = torch.compile(plain, dynamic=True)
    first_call = {n: t_of(compiled, n, 1) for n in ns}
    after = {n: t_of(compiled, n, repeats) for n in ns}
    model.forward = compiled
    try:
        invariant = row_invariant(model, ids, ids.numel() - 17)
        t0 = time.perf_counter()
        full_compiled = model(input_ids=ids[None]).logits
        first_call["prefill"] = time.perf_counter() - t0
    finally:
        model.forward = plain
    full = model(input_ids=ids[None]).logits
    return {"protocol": f"median of {repeats} timed forwards per width n, the eager forwards before the compiled ones",
            "ns": list(ns), "eager_mode_s": before, "compiled_s": after, "first_call_s": first_call,
            "compiled_invariant": invariant, "max_logit_diff": float((full_compiled - full).abs().max()),
            "same_argmax": bool(torch.equal(full_compiled.argmax(-1), full.argmax(-1)))}


COMPILE_TABLE = Path(__file__).resolve().parents[1] / "data" / "measured" / "compile_check.json"


def stored_compile_check(path=COMPILE_TABLE) -> dict:
    """The :func:`compile_check` figures stored with the course (measured on the course machine by
    ``python -m specdecode_ref.measure.backends --dtype fp32 --compile``; the command, the machine
    line and the configuration are in the file): what the notebooks cite, since compiling takes
    longer than a notebook may run."""
    import json

    table = json.loads(Path(path).read_text())
    for key in ("eager_mode_s", "compiled_s", "first_call_s"):
        table[key] = {(int(k) if k.isdigit() else k): float(v) for k, v in table[key].items()}
    return table


def main(argv=None) -> None:
    import argparse
    import json
    import platform

    from .. import chat_ids, load_model
    from .harness.workloads import load_heldout, load_workloads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--per-category", type=int, default=None, help="prompts per category (default: all)")
    parser.add_argument("--skip-agreement", action="store_true")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile around the fast model (minutes)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    from .harness.claims import machine_line

    torch.manual_seed(0)
    fast, tok = load_model(dtype=args.dtype, device="cpu", backend="fast")
    eager, _ = load_model(dtype=args.dtype, device="cpu", backend="eager")
    print(machine_line())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, {platform.machine()}")
    floor = memory_floor(fast)
    print(f"bandwidth {floor['bandwidth_gbs']:.1f} GB/s, weights {floor['weight_bytes'] / 1e6:.0f} MB, "
          f"memory floor {floor['floor_ms']:.1f} ms per forward")
    products = product_times(fast.lm_head.weight.detach())
    print(products.round(2).to_string())
    curves = cost_curves({"eager": eager, "fast": fast}, ns=(1, 2, 3, 4, 5, 7, 9, 13, 17), rounds=7)
    for name, c in curves.items():
        print(f"{name:>5}: T(1) = {c['times_s'][0] * 1e3:.1f} ms = {c['times_s'][0] * 1e3 / floor['floor_ms']:.2f}x floor; "
              + " ".join(f"T({n})/T(1)={r:.2f}" for n, r in zip(c["ns"], c["relative"])))
    ids = chat_ids(tok, load_workloads()["summarization"][0]["messages"])
    inv = {name: row_invariant(m, ids, ids.numel() - 17) for name, m in (("eager", eager), ("fast", fast))}
    for name, flags in inv.items():
        print(f"{name:>5}: logits bitwise equal to a 16-token forward's for n = 1..15: {sum(flags)}/{len(flags)}")
    result = {"machine": machine_line(), "dtype": args.dtype, "floor": floor, "curves": curves,
              "products": products.reset_index().to_dict(orient="records"), "invariant": inv}
    if args.compile:
        comp = compile_check(fast, ids, ids.numel() - 17)
        print("torch.compile around the fast model: "
              + "; ".join(f"T({n}) {comp['eager_mode_s'][n] * 1e3:.1f} -> {comp['compiled_s'][n] * 1e3:.1f} ms"
                          for n in comp["ns"])
              + f"; first calls (compiling) {', '.join(f'{k}: {v:.0f} s' for k, v in comp['first_call_s'].items())}; "
              f"bitwise invariant for n = 1..15: {sum(comp['compiled_invariant'])}/15; logits move by up to "
              f"{comp['max_logit_diff']:.1e} (same argmax: {comp['same_argmax']})")
        result["compile"] = comp
    if not args.skip_agreement:
        prompts = {}
        for source in (load_workloads(per_category=args.per_category), load_heldout(per_category=args.per_category)):
            for items in source.values():
                for item in items:
                    prompts[item["id"]] = chat_ids(tok, item["messages"])
        agree = greedy_agreement(fast, eager, prompts, max_new_tokens=args.max_new_tokens)
        differ = agree[~agree["same"]]
        speed = (agree["fast_tok_s"] / agree["eager_tok_s"])
        print(f"greedy, {len(agree)} prompts x {args.max_new_tokens} tokens: {int(agree['same'].sum())} identical; "
              f"plain decoding fast/eager {speed.median():.2f}x (median per prompt; "
              f"{agree['fast_tok_s'].median():.1f} vs {agree['eager_tok_s'].median():.1f} tokens/s)")
        if len(differ):
            print(differ.to_string(index=False))
        result["agreement"] = agree.to_dict(orient="records")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=float)


if __name__ == "__main__":
    main()
