"""Where the time of one decoded token goes, and what standard tools take off it.

Plain decoding of one request is a loop of one-token forwards. Its time per token splits into

* the **operators** of the forward (matrix products, attention, norms: what the hardware computes),
* the **framework overhead** of the forward (Python module calls, dispatch, allocating the
  growing KV cache: everything in ``model(...)`` that is not an operator),
* the **engine overhead** outside the forward (choosing the token, bookkeeping, EOS checks).

:func:`profile_plain` measures the three on the same prompts, then decodes the same tokens with
two standard fixes for the framework share: a **static KV cache** (transformers ``StaticCache``:
allocated once at full length, so every step has the same shapes and no tensor grows) and
``torch.compile`` of the forward on top of it (one fused graph instead of hundreds of Python-level
module calls). Every variant is checked to produce the same greedy tokens as ours.

    python -m specdecode_ref.measure.engine_profile --prompts 4 --max-new-tokens 64 --compile

Production engines do the same: vLLM compiles the model with ``torch.compile`` and captures CUDA
graphs (``vllm/compilation/``), and keeps its KV cache in preallocated blocks. Timings mean
something only on a quiet machine (``measure.harness.timing.check_quiet``).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass

import torch

from ..engine import autoregressive_generate
from .harness.timing import sync_device


@dataclass
class LoopTiming:
    """One variant's decode of every prompt: the tokens, the decode time (prefill excluded) and
    how much of it was spent inside the model's forward."""

    name: str
    tokens: list  # per prompt, the generated ids
    decode_s: float
    forward_s: float
    decoded: int  # tokens decoded after the prefill's first one

    @property
    def ms_per_token(self) -> float:
        return 1e3 * self.decode_s / max(self.decoded, 1)

    @property
    def forward_ms_per_token(self) -> float:
        return 1e3 * self.forward_s / max(self.decoded, 1)


def _ours(model, prompts, max_new_tokens: int) -> LoopTiming:
    tokens, decode_s, forward_s, decoded = [], 0.0, 0.0, 0
    for p in prompts:
        r = autoregressive_generate(model, p, max_new_tokens=max_new_tokens, stop_on_eos=False)
        tokens.append(r.tokens.tolist())
        decode_s += r.stats.wall_time_s - r.stats.prefill_time_s
        forward_s += r.stats.target_time_s - r.stats.prefill_time_s
        decoded += len(r.tokens) - 1
    return LoopTiming("ours (DynamicCache)", tokens, decode_s, forward_s, decoded)


def _bare_loop(model, prompts, max_new_tokens: int, name: str, static: bool = False, forward=None,
               cache_len: int | None = None) -> LoopTiming:
    """The least a Python loop can do per token: forward, argmax, append. ``static``: a
    StaticCache allocated for prompt + output at the start, positions passed as a tensor;
    ``forward``: the (compiled) callable for the one-token steps (the
    prefill always runs eagerly)."""
    from transformers import DynamicCache, StaticCache

    device = next(model.parameters()).device
    step_forward = forward or model
    tokens, decode_s, forward_s, decoded = [], 0.0, 0.0, 0
    cache_len = cache_len or max(p.numel() for p in prompts) + max_new_tokens
    for p in prompts:
        p = p.to(device).reshape(1, -1)
        n = p.shape[1]
        cache = (StaticCache(config=model.config, max_cache_len=cache_len) if static
                 else DynamicCache(config=model.config))
        out = model(input_ids=p, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        ids = [int(nxt)]
        sync_device(device)
        t0 = time.perf_counter()
        fwd = 0.0
        for i in range(max_new_tokens - 1):
            f0 = time.perf_counter()
            # Positions as a tensor: a compiled graph then serves every step (read from the cache
            # as a Python int, the position would be baked into the graph and recompile it).
            kw = {"position_ids": torch.tensor([[n + i]], device=device)} if static else {}
            out = step_forward(input_ids=nxt, past_key_values=cache, use_cache=True, **kw)
            sync_device(device)
            fwd += time.perf_counter() - f0
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            ids.append(int(nxt))
        sync_device(device)
        decode_s += time.perf_counter() - t0
        forward_s += fwd
        decoded += max_new_tokens - 1
        tokens.append(ids)
    return LoopTiming(name, tokens, decode_s, forward_s, decoded)


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side prints start/stop lines on file descriptor 2; keep them out of
    notebooks and logs."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def operator_share(model, prompt, context: int = 64, steps: int = 8) -> dict:
    """One-token forwards under ``torch.profiler``: the share of the forwards' wall time spent inside
    operators (aten's and the fast backend's ``specdecode::`` kernels, each counted once: an operator
    called by another is inside its caller's time) against everything else in the forward (Python,
    module calls, dispatch). Only the forwards are timed and profiled, not the argmax between them.

    Returns ``wall_ms_per_step`` (profiled forward), ``unprofiled_ms_per_step`` (the same forwards
    without the profiler, which adds its own overhead), ``operator_ms_per_step``,
    ``operator_share`` (of the profiled forward; at most 1) and ``top_ops_ms`` (the six largest)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers import DynamicCache

    device = next(model.parameters()).device
    p = prompt.to(device).reshape(1, -1)[:, :context]

    def forwards(profiled: bool) -> float:
        cache = DynamicCache(config=model.config)
        out = model(input_ids=p, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        wall = 0.0
        for _ in range(steps):
            sync_device(device)
            t0 = time.perf_counter()
            if profiled:
                with record_function("forward"):
                    out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            else:
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            sync_device(device)
            wall += time.perf_counter() - t0
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return wall

    unprofiled = forwards(False)
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = forwards(True)

    def is_op(e) -> bool:
        return e.name.startswith(("aten::", "specdecode::"))

    def top_level_in_forward(e) -> bool:
        """An operator inside a timed forward with no operator above it (so nothing counts twice)."""
        inside, parent = False, e.cpu_parent
        while parent is not None:
            if is_op(parent):
                return False
            inside |= parent.name == "forward"
            parent = parent.cpu_parent
        return inside

    top = [e for e in prof.events() if is_op(e) and top_level_in_forward(e)]
    ops_s = sum(e.cpu_time_total for e in top) / 1e6
    by_op: dict = {}
    for e in top:
        by_op[e.name] = by_op.get(e.name, 0.0) + e.cpu_time_total / 1e6
    biggest = sorted(by_op.items(), key=lambda kv: -kv[1])[:6]
    return {"wall_ms_per_step": 1e3 * wall / steps, "unprofiled_ms_per_step": 1e3 * unprofiled / steps,
            "operator_ms_per_step": 1e3 * ops_s / steps, "operator_share": min(ops_s / wall, 1.0),
            "top_ops_ms": {k: round(1e3 * v / steps, 2) for k, v in biggest}}


def profile_plain(model, prompts, max_new_tokens: int = 64, compile: bool = False, progress: bool = True):
    """Plain greedy decoding of ``prompts`` (1-D LongTensors) one request at a time, four ways (our
    engine, a bare loop, a static cache, static cache + torch.compile). Returns (a pandas DataFrame
    with ms per token, forward ms per token, tokens/s, speed relative to ours and whether the
    tokens equal ours; a dict with the compile time)."""
    import pandas as pd
    from tqdm.auto import tqdm

    if max_new_tokens < 2:
        raise ValueError(f"max_new_tokens must be >= 2 to time decode steps, got {max_new_tokens!r}")
    prompts = list(prompts)
    cache_len = max(p.numel() for p in prompts) + max_new_tokens  # one static shape for every prompt
    extra = {}
    variants = ["ours", "bare", "static"] + (["compiled"] if compile else [])
    runs = []
    with torch.inference_mode():
        # Warm up every path once (allocator, kernels), out of the timing.
        autoregressive_generate(model, prompts[0], max_new_tokens=4, stop_on_eos=False)
        for v in tqdm(variants, desc="variants", disable=not progress):
            if v == "ours":
                runs.append(_ours(model, prompts, max_new_tokens))
            elif v == "bare":
                _bare_loop(model, prompts[:1], 4, "warm-up")
                runs.append(_bare_loop(model, prompts, max_new_tokens, "bare loop (DynamicCache)"))
            elif v == "static":
                _bare_loop(model, prompts[:1], 4, "warm-up", static=True, cache_len=cache_len)
                runs.append(_bare_loop(model, prompts, max_new_tokens, "static cache", static=True))
            else:
                compiled = torch.compile(model.forward, dynamic=False)
                t0 = time.perf_counter()
                _bare_loop(model, prompts[:1], 4, "compile", static=True, forward=compiled, cache_len=cache_len)
                extra["compile_s"] = time.perf_counter() - t0
                runs.append(_bare_loop(model, prompts, max_new_tokens, "static cache + torch.compile",
                                       static=True, forward=compiled))
        extra["operators"] = operator_share(model, prompts[0])
    base = runs[0]
    rows = [{"variant": r.name, "ms_per_token": r.ms_per_token, "forward_ms_per_token": r.forward_ms_per_token,
             "outside_forward_ms": r.ms_per_token - r.forward_ms_per_token,
             "tok_per_s": 1e3 / r.ms_per_token, "speed_vs_ours": base.ms_per_token / r.ms_per_token,
             "same_tokens_as_ours": r.tokens == base.tokens} for r in runs]
    return pd.DataFrame(rows), extra


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4, help="benchmark prompts (one per category, cycled)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="also time static cache + torch.compile")
    args = ap.parse_args(argv)
    from ..models import chat_ids, load_model
    from .harness.timing import start_timed_cli
    from .harness.workloads import load_workloads

    start_timed_cli(args.threads)
    model, tok = load_model(dtype=args.dtype)
    items = [item for group in load_workloads(per_category=1).values() for item in group]
    prompts = [chat_ids(tok, item["messages"]) for item in items][: args.prompts]
    table, extra = profile_plain(model, prompts, args.max_new_tokens, compile=args.compile)
    import pandas as pd

    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(table.round(3).to_string(index=False))
    ops = extra["operators"]
    print(f"\none-token forward: {ops['wall_ms_per_step']:.1f} ms, of which operators {ops['operator_ms_per_step']:.1f} ms "
          f"({100 * ops['operator_share']:.0f} %); largest: {ops['top_ops_ms']}")
    if "compile_s" in extra:
        print(f"torch.compile: {extra['compile_s']:.1f} s to compile (once per shape)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
