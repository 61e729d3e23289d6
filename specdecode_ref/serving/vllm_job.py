"""One vLLM job, run inside vLLM's own virtual environment (not our package's): JSON in, JSON out.

This file imports only the standard library and vLLM, because vLLM pins a transformers version
our environment does not have; ``vllm_runner.run_vllm`` starts it as
``<vllm python> vllm_job.py job.json result.json``. It is the same code on a CUDA machine with the
official ``vllm`` package.

A job: ``{"model": DIR, "prompts": [[token ids], ...], "max_tokens": int, "temperature": float,
"top_p": float, "seed": int, "dtype": "float32" | "bfloat16", "speculative_config": dict | null,
"one_at_a_time": bool, "max_model_len": int}``. The result: per prompt the generated token ids and
its wall time, the total wall time, the start-up time, and every ``vllm:spec_decode_*`` metric
from ``LLM.get_metrics()`` (counters as ints, per-position vectors as lists).
"""
import json
import sys
import time


def run(job: dict) -> dict:
    from vllm import LLM, SamplingParams  # imported here: vLLM spawns its engine process

    t0 = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job.get("dtype", "float32"),
              speculative_config=job.get("speculative_config"), max_model_len=job.get("max_model_len", 2048),
              enforce_eager=True, disable_log_stats=False, seed=job.get("seed", 0))
    startup_s = time.perf_counter() - t0
    params = SamplingParams(temperature=job.get("temperature", 0.0), top_p=job.get("top_p", 1.0),
                            max_tokens=job["max_tokens"], ignore_eos=job.get("ignore_eos", False),
                            seed=job.get("seed", 0))
    prompts = [{"prompt_token_ids": list(map(int, ids))} for ids in job["prompts"]]
    if job.get("warmup", True):
        llm.generate(prompts[:1], params, use_tqdm=False)
    before = _spec_metrics(llm)
    outputs, seconds = [], []
    t0 = time.perf_counter()
    if job.get("one_at_a_time", True):
        for p in prompts:
            t1 = time.perf_counter()
            out = llm.generate([p], params, use_tqdm=False)[0]
            seconds.append(time.perf_counter() - t1)
            outputs.append(list(out.outputs[0].token_ids))
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
        outputs = [list(o.outputs[0].token_ids) for o in outs]
    total_s = time.perf_counter() - t0
    after = _spec_metrics(llm)
    return {"tokens": outputs, "seconds": seconds, "total_s": total_s, "startup_s": startup_s,
            "metrics": _difference(after, before)}


def _spec_metrics(llm) -> dict:
    """vLLM's speculative-decoding counters (Prometheus names, cumulative since start-up)."""
    found = {}
    for m in llm.get_metrics():
        if "spec_decode" not in m.name:
            continue
        if hasattr(m, "values"):
            found[m.name] = [int(v) for v in m.values]
        elif hasattr(m, "value"):
            found[m.name] = m.value
    return found


def _difference(after: dict, before: dict) -> dict:
    """The counters of the timed part only (the warm-up request is subtracted)."""
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or []
            out[name] = [v - (old[i] if i < len(old) else 0) for i, v in enumerate(value)]
        elif isinstance(value, (int, float)) and isinstance(old, (int, float)):
            out[name] = value - old
        else:
            out[name] = value
    return out


if __name__ == "__main__":
    job_path, result_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    result = run(job)
    with open(result_path, "w") as f:
        json.dump(result, f)
