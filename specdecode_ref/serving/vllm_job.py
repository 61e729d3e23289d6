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

A load sweep (the job has ``"loads": [1, 4, ...]``): for each load L every prompt is submitted
at time 0 and exactly L of them are in flight at once, a finished request's place going to the
next one (continuous refill, as a server capped at ``--max-concurrency`` L). The loop drives
vLLM's engine one step at a time (``LLM.llm_engine.add_request`` / ``step``, the loop of
``LLM._run_engine`` in ``vllm/entrypoints/common/offline.py``) with outputs in DELTA mode, so each
step's new tokens of each request arrive with the wall-clock time of that step. The result, per
load: the token ids per prompt, per prompt the chunks ``[seconds since time 0, new tokens]``,
the load's wall time and the difference of the ``spec_decode`` counters over that load.

Several speculative settings in one job (``"speculative_configs": [null, {...}]``): one LLM
instance per setting, started one after the other in this process, so vLLM is imported once.
``"in_process": true`` runs vLLM's engine core and its worker inside this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``, set by the runner):
each of them would otherwise be a process of its own that imports torch and vLLM again, which on
a 2-core laptop is most of a start-up. The result then has ``"runs"``, one sweep result per setting.
"""
import json
import sys
import time


def _start(job: dict, **engine_args):
    """One LLM instance for the job's model, dtype and speculative settings; (llm, seconds)."""
    from vllm import LLM  # imported here: vLLM spawns its engine process

    if job.get("in_process"):
        engine_args.setdefault("distributed_executor_backend", "uni")
    t0 = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job.get("dtype", "float32"),
              speculative_config=job.get("speculative_config"), max_model_len=job.get("max_model_len", 2048),
              enforce_eager=True, disable_log_stats=False, seed=job.get("seed", 0), **engine_args)
    return llm, time.perf_counter() - t0


def run(job: dict) -> dict:
    if job.get("loads") and "speculative_configs" in job:
        runs = []
        for config in job["speculative_configs"]:
            one = dict(job, speculative_config=config)
            one.pop("speculative_configs")
            runs.append(run_sweep(one, shutdown=True))
            import gc

            gc.collect()  # the stopped instance's KV cache goes before the next one allocates its own
        return {"startup_s": sum(r["startup_s"] for r in runs), "runs": runs}
    if job.get("loads"):
        return run_sweep(job)
    from vllm import SamplingParams

    llm, startup_s = _start(job)
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


def run_sweep(job: dict, shutdown: bool = False) -> dict:
    """Every load of ``job["loads"]`` on one LLM instance (one speculative setting); shutdown: stop
    the engine afterwards, so that the next setting's instance starts on a free machine."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    loads = [int(x) for x in job["loads"]]
    # No prefix caching: every load serves the same prompts, and the course's scheduler has none,
    # so a cached prefill would make vLLM's later loads cheaper for a reason unrelated to the load.
    llm, startup_s = _start(job, max_num_seqs=max(loads), enable_prefix_caching=False)

    def params(kind):
        return SamplingParams(temperature=job.get("temperature", 0.0), top_p=job.get("top_p", 1.0),
                              max_tokens=job["max_tokens"], ignore_eos=job.get("ignore_eos", False),
                              seed=job.get("seed", 0), detokenize=False, output_kind=kind)

    if job.get("warmup", True):  # one-time costs (allocator, first kernels) stay out of the first load
        llm.generate([{"prompt_token_ids": list(map(int, job["prompts"][0]))}], params(RequestOutputKind.FINAL_ONLY),
                     use_tqdm=False)
    per_load = []
    for i, load in enumerate(loads):  # a load may repeat (repeated runs): each run its own request ids
        prompts = [_engine_input(llm, ids) for ids in job["prompts"]]  # fresh per load: the engine owns them
        before = _spec_metrics(llm)
        served = serve_at_load(llm.llm_engine, prompts, params(RequestOutputKind.DELTA), load, tag=f"L{load}r{i}")
        served["load"] = load
        served["metrics"] = _difference(_spec_metrics(llm), before)
        per_load.append(served)
    import torch

    result = {"startup_s": startup_s, "loads": per_load, "torch_threads": torch.get_num_threads()}
    if shutdown:
        _shutdown(llm)
    return result


def _shutdown(llm) -> None:
    """Stop an LLM instance's engine and free its memory (its KV cache is gigabytes)."""
    import gc

    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


def _engine_input(llm, ids):
    """The prompt as the engine takes it: rendered once, outside the timed loop, where vLLM allows."""
    prompt = {"prompt_token_ids": [int(t) for t in ids]}
    render = getattr(llm, "_preprocess_cmpl_one", None)
    return render(prompt) if render is not None else prompt


def serve_at_load(engine, prompts, params, load: int, tag: str = "r", clock=time.perf_counter) -> dict:
    """Serve ``prompts`` keeping exactly ``load`` requests in flight (fewer only when none wait).

    engine: ``LLM.llm_engine`` (``add_request(request_id, prompt, params)``, ``step()`` returning
    outputs with ``request_id``, ``outputs[0].token_ids`` and ``finished``); params must ask for
    DELTA outputs, so each output holds only that step's new tokens. All requests count as arrived
    at time 0, so a request's time to first token includes its wait for a place.
    """
    if load < 1:
        raise ValueError(f"a load is at least 1 request in flight, got {load}")
    waiting = list(range(len(prompts)))
    index, in_flight = {}, set()
    tokens = [[] for _ in prompts]
    chunks = [[] for _ in prompts]
    max_in_flight = 0

    def refill():
        while waiting and len(in_flight) < load:
            i = waiting.pop(0)
            rid = f"{tag}-{i}"
            index[rid] = i
            engine.add_request(rid, prompts[i], params)
            in_flight.add(i)

    t0 = clock()
    refill()
    while in_flight:
        max_in_flight = max(max_in_flight, len(in_flight))
        outputs = engine.step()
        now = clock() - t0
        for out in outputs:
            i = index[out.request_id]
            new = [int(t) for t in out.outputs[0].token_ids]
            if new:
                tokens[i].extend(new)
                chunks[i].append([now, len(new)])
            if out.finished:
                in_flight.discard(i)
        refill()
    return {"tokens": tokens, "chunks": chunks, "wall_s": clock() - t0, "max_in_flight": max_in_flight}


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
