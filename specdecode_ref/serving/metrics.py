"""Serving metrics as engines report them: throughput, TTFT, inter-token latency, and vLLM's
speculative-decoding counters.

* throughput: output tokens per second of the whole run (all requests together).
* TTFT (time to first token): from a request's arrival to its first output token.
* ITL (inter-token latency): the gap between two consecutive outputs of one request. With
  speculation one step may emit several tokens at once; like vLLM's serving benchmark
  (``vllm bench serve``, ``vllm/benchmarks/serve.py``: ``itl``) one gap is recorded per output chunk, so ITL
  measures how often a user sees progress, and TPOT (time per output token, (latency - TTFT) /
  (tokens - 1)) how fast the text grows.
Latencies are given in wall-clock seconds and in scheduler steps (the schedule itself, without
the machine's speed).

Counters use vLLM's names (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingStats``, and the
Prometheus names below): ``spec_decode_num_drafts`` (request-steps that
drafted something), ``_num_draft_tokens``, ``_num_accepted_tokens`` and
``_num_accepted_tokens_per_pos`` (drafts whose first i+1 tokens were all accepted). The course's
SpecStats (metrics.py) pooled over requests gives the same numbers and tau.
"""
from __future__ import annotations

import numpy as np

from ..metrics import merge_stats

# vLLM's Prometheus names for its speculative-decoding counters (``LLM.get_metrics()``).
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def latencies(requests) -> dict:
    """Per-request TTFT and TPOT and the pooled ITL samples, in seconds and in steps."""
    ttft_s, ttft_steps, itl_s, itl_steps, tpot_s, e2e_s = [], [], [], [], [], []
    for r in requests:
        if not r.emissions:
            continue
        ttft_s.append(r.first_token_time - r.arrival_time)
        ttft_steps.append(r.first_token_step - r.arrival_step + 1)  # the step that produced it counts
        times = [t for t, _, _ in r.emissions]
        steps = [s for _, s, _ in r.emissions]
        itl_s.extend(np.diff(times).tolist())
        itl_steps.extend(np.diff(steps).tolist())
        e2e_s.append(r.emissions[-1][0] - r.arrival_time)
        n = r.num_output_tokens
        if n > 1:
            tpot_s.append((r.emissions[-1][0] - r.first_token_time) / (n - 1))
    return {"ttft_s": ttft_s, "ttft_steps": ttft_steps, "itl_s": itl_s, "itl_steps": itl_steps,
            "tpot_s": tpot_s, "e2e_s": e2e_s}


def _tpot(r) -> float:
    """A request's time per output token after the first, (last - first emission) / (tokens - 1)."""
    n = r.num_output_tokens
    if not r.emissions or n < 2:
        return float("nan")
    return (r.emissions[-1][0] - r.first_token_time) / (n - 1)


def vllm_counters(stats) -> dict:
    """vLLM's speculative-decoding counters from a (pooled) SpecStats, under vLLM's names."""
    return {DRAFTS: int(stats.drafting_steps), DRAFT_TOKENS: int(stats.drafted),
            ACCEPTED_TOKENS: int(stats.accepted), ACCEPTED_PER_POS: [int(x) for x in stats.accepted_per_position]}


def serving_metrics(result) -> dict:
    """One row of numbers for a finished run (``scheduler.ServingResult``)."""
    reqs = result.requests
    lat = latencies(reqs)
    stats = merge_stats(r.stats for r in reqs)
    tokens = sum(r.num_output_tokens for r in reqs)
    decode_steps = [s for s in result.steps if s.batch_size > 0]
    out = {
        "requests": len(reqs), "output_tokens": tokens, "wall_s": result.wall_s, "steps": len(result.steps),
        "throughput_tok_s": tokens / result.wall_s if result.wall_s > 0 else float("nan"),
        "tokens_per_step": tokens / len(result.steps) if result.steps else float("nan"),
        "ttft_p50_s": _pct(lat["ttft_s"], 50), "ttft_p99_s": _pct(lat["ttft_s"], 99),
        "itl_p50_s": _pct(lat["itl_s"], 50), "itl_p99_s": _pct(lat["itl_s"], 99),
        "tpot_mean_s": float(np.mean(lat["tpot_s"])) if lat["tpot_s"] else float("nan"),
        "ttft_p50_steps": _pct(lat["ttft_steps"], 50), "ttft_p99_steps": _pct(lat["ttft_steps"], 99),
        "itl_p50_steps": _pct(lat["itl_steps"], 50), "itl_p99_steps": _pct(lat["itl_steps"], 99),
        "mean_batch_size": float(np.mean([s.batch_size for s in decode_steps])) if decode_steps else 0.0,
        "mean_k": float(np.mean([s.k for s in decode_steps])) if decode_steps else 0.0,
        # where a decode step's time goes: drafting, and the decode forward with its verification
        "draft_s_per_decode_step": float(np.mean([s.draft_s for s in decode_steps])) if decode_steps else 0.0,
        "decode_s_per_decode_step": float(np.mean([s.decode_s for s in decode_steps])) if decode_steps else 0.0,
        "decode_steps": len(decode_steps),
        "acceptance_rate": stats.acceptance_rate, "tau": stats.mean_accepted_length,
        "vllm_mean_acceptance_length": stats.vllm_mean_acceptance_length,
        "preemptions": result.num_preemptions, "peak_blocks": result.blocks.peak_used,
        "num_blocks": result.blocks.num_blocks,
        # per request, in the order they were added (NaN: fewer than 2 tokens): paired comparisons
        "tpot_per_request_s": [_tpot(r) for r in reqs],
        # drafts whose position i was tested (drafted, every earlier one accepted): the denominator
        # of the conditional per-position rate, which vLLM's counters do not carry
        "reached_per_pos": [int(x) for x in stats.reached_per_position],
    }
    out.update({name.removeprefix("vllm:"): value for name, value in vllm_counters(stats).items()})
    return out
