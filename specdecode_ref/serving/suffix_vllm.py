"""Our suffix decoding beside vLLM's (``method="suffix"``), request by request, on a repeating stream.

Both engines decode the same stream greedily in fp32, one request at a time in arrival order, each
with one suffix cache for the whole stream (vLLM's proposer keeps Arctic Inference's
``SuffixDecodingCache`` for the life of the engine; ours is one ``load_proposer("suffix", model)``
object), with vLLM's defaults on both sides. Per request the table has both outputs (equal to each
other and to plain greedy decoding: drafts never change a greedy output) and both engines'
counters: drafts (steps that drafted), draft tokens and accepted tokens, from which the mean
acceptance length (1 + accepted / drafts, as vLLM reports it) and the acceptance rate
(accepted / draft tokens) follow.

Three things make the raw counters differ although the drafting rule is the same.

* **The last step.** Our engine cuts every draft to what the step could still emit (max_new_tokens
  minus the tokens so far, minus the target's own token). vLLM drafts up to k whatever the budget,
  verifies all of it, counts every accepted token, and only then trims the output to max_tokens;
  its worker also adds the untrimmed tokens of that step to the suffix cache. So vLLM reports more
  draft tokens (and sometimes more accepted tokens) than could be emitted, and its global tree may
  hold a few tokens past a response's end. The job below reads vLLM's counters after every engine
  step, so they can be recounted within max_tokens: each step's draft and accepted counts cut to
  the budget left, which is what our engine counts. The comparison is made on that recount.
* **The warm-up request.** ``vllm_job.run`` serves the stream's first prompt once before timing,
  and that response stays in the global tree: the first request then drafts its own answer
  almost entirely, and a second copy of it shifts the counts later requests draft from. Counters
  need no warm engine, so this module's job serves no warm-up (``vllm_warmup=True`` shows the
  effect).
* **Ties.** When two continuations of a match are equally frequent, our tree drafts the smaller
  token id. Arctic's tree keeps each node's children in a list ordered by count, and among equal
  counts the order is that of the history of updates, so it may draft the other one. Such drafts
  differ token for token (``drafts_differ`` counts them); the counters differ only when one of
  the tied tokens is the one the target takes, which then also changes what the trees learn.

On the committed measurement the recount agrees with our counters on every step of every
request; what remains different is a few drafts decided by ties, rejected on both sides. A tie can
move the counters too: with 24 new tokens per request (the test of this module) one tie in the
code request drafts a token the target takes in our tree and another one in Arctic's, and the two
sides' counts part from that step on.
``first_step_differs`` gives the first verification step whose (draft, accepted) pair differs,
``vllm_tail_cached`` the tokens vLLM cached past a response's end.

    from specdecode_ref import load_model
    from specdecode_ref.measure.harness.workloads import load_repeating
    model, tok = load_model(dtype="fp32")
    result = compare_with_vllm(model, tok, load_repeating(per_family=2), max_new_tokens=48)
    summarize(result)                      # ours, vLLM as reported, vLLM within max_tokens

    python -m specdecode_ref.serving.suffix_vllm --per-family 2 --max-new-tokens 48 \\
        --out specdecode_ref/data/measured/suffix_vllm.json

The stored result (:func:`load_vllm_comparison`) lets a notebook show the table without vLLM.

This file is also the job that runs inside vLLM's own environment (``python suffix_vllm.py
--vllm-job job.json result.json``), so everything at module level is standard library only.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

#: What the stored side-by-side holds instead of timings (``measure.harness.protocol.untimed``).
UNTIMED = ("both engines' counters and outputs, one request at a time, greedy; the seconds record how long the "
           "run took, not a comparison of speed")
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "measured" / "suffix_vllm.json"
SIDES = ("ours", "vllm", "vllm_within")  # vllm: as vLLM reports; vllm_within: recounted within max_tokens
SIDE_NAMES = {"ours": "ours", "vllm": "vLLM (as reported)", "vllm_within": "vLLM within max_tokens"}
COUNTERS = ("drafts", "draft_tokens", "accepted")


# --- inside vLLM's environment ---------------------------------------------------------------------

def _vllm_job(job: dict) -> dict:
    """Serve ``job["prompts"]`` one at a time on one LLM instance, stepping the engine by hand and
    reading vLLM's speculative-decoding counters after every step. Per request: the output ids and
    per step ``[draft tokens, accepted, drafts, new tokens, tokens before the step]``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_job", job["job_script"])  # stdlib and vLLM only
    J = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(J)
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    proposed = _record_vllm_drafts(job.get("record", "suffix"))
    llm, startup_s = J._start(job, enable_prefix_caching=False)  # our engine has no prefix cache either
    engine = llm.llm_engine
    names = {"draft_tokens": "vllm:spec_decode_num_draft_tokens", "accepted": "vllm:spec_decode_num_accepted_tokens",
             "drafts": "vllm:spec_decode_num_drafts"}

    def counters():
        m = J._spec_metrics(llm)
        return {k: int(m.get(v, 0)) for k, v in names.items()}

    def serve(rid, ids, max_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=int(max_tokens), seed=job.get("seed", 0),
                                detokenize=False, output_kind=RequestOutputKind.DELTA)
        engine.add_request(rid, J._engine_input(llm, ids), params)
        tokens, steps = [], []
        start = len(proposed)
        prev = counters()
        finished = False
        t0 = time.perf_counter()
        while not finished:
            outs = engine.step()
            now = counters()
            new = []
            for o in outs:
                if o.request_id == rid:
                    new = [int(t) for t in o.outputs[0].token_ids]
                    finished = finished or o.finished
            steps.append([now["draft_tokens"] - prev["draft_tokens"], now["accepted"] - prev["accepted"],
                          now["drafts"] - prev["drafts"], len(new), len(tokens)])
            tokens.extend(new)
            prev = now
        return {"tokens": tokens, "steps": steps, "seconds": time.perf_counter() - t0, "drafts": proposed[start:]}

    if job.get("warmup") is not None:  # as vllm_job does; its counters are left out (not its tree entry)
        serve("warmup", job["warmup"], job["max_tokens"])
    t0 = time.perf_counter()
    served = [serve(f"r{i}", ids, job["max_tokens"]) for i, ids in enumerate(job["prompts"])]
    import vllm

    try:
        from importlib.metadata import version

        arctic = version("arctic_inference")
    except Exception:
        arctic = None
    return {"requests": served, "startup_s": startup_s, "total_s": time.perf_counter() - t0,
            "vllm_version": vllm.__version__, "arctic_inference": arctic}


def _record_vllm_drafts(method: str = "suffix") -> list:
    """Wrap the ``propose`` of vLLM's drafter for ``method`` so that every draft is also appended to
    the list returned. "suffix": ``[output tokens so far, draft ids]`` (SuffixDecodingProposer);
    "eagle" (EAGLE, EAGLE-3 and draft models: SpecDecodeBaseProposer) and "medusa": the draft ids of
    the first request in the batch, one entry per drafting step (the stream serves one request at a
    time). The proposer runs in this process only when the engine does (``in_process``); otherwise
    the list stays empty. None records nothing."""
    log: list = []
    if method is None:
        return log
    if method == "suffix":
        from vllm.v1.spec_decode import suffix_decoding as SD

        original = SD.SuffixDecodingProposer.propose

        def propose(self, num_speculative_tokens, input_batch, sampled_token_ids, *args, **kwargs):
            drafts = original(self, num_speculative_tokens, input_batch, sampled_token_ids, *args, **kwargs)
            for i, draft in enumerate(drafts):
                if sampled_token_ids[i]:  # a partial prefill does not draft
                    index = input_batch.req_id_to_index[input_batch.req_ids[i]]
                    done = int(input_batch.num_tokens_no_spec[i]) - int(input_batch.num_prompt_tokens[index])
                    log.append([done, [int(t) for t in draft]])
            return drafts

        SD.SuffixDecodingProposer.propose = propose
        return log
    if method == "eagle":
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as cls
    elif method == "medusa":
        from vllm.v1.spec_decode.medusa import MedusaProposer as cls
    else:
        raise ValueError(f"no draft recorder for {method!r}")
    original_any = cls.propose

    def propose_any(self, *args, **kwargs):
        out = original_any(self, *args, **kwargs)
        drafts = out[0] if isinstance(out, tuple) else out
        if hasattr(drafts, "tolist") and len(drafts):
            log.append([int(t) for t in drafts[0].reshape(-1).tolist()])
        return out

    cls.propose = propose_any
    return log


# --- in the course's environment -------------------------------------------------------------------

def suffix_settings(settings: dict | None = None) -> tuple:
    """(keyword arguments for ``load_proposer("suffix", ...)``, vLLM's speculative config) for the
    same settings. settings: any of k, max_tree_depth, max_cached_requests, max_spec_factor,
    min_token_prob (vLLM's defaults otherwise; k defaults to max_tree_depth, as in vLLM)."""
    from .vllm_runner import suffix_config

    known = {"k", "max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob"}
    settings = dict(settings or {})
    unknown = set(settings) - known
    if unknown:
        raise ValueError(f"unknown suffix settings {sorted(unknown)}; choose from {sorted(known)}")
    config = suffix_config(**settings)
    ours = {"k": config["num_speculative_tokens"], "max_tree_depth": config["suffix_decoding_max_tree_depth"],
            "max_cached_requests": config["suffix_decoding_max_cached_requests"],
            "max_spec_factor": config["suffix_decoding_max_spec_factor"],
            "min_token_prob": config["suffix_decoding_min_token_prob"]}
    return ours, config


def run_vllm_stream(model_dir, prompts: list, max_tokens: int, speculative_config: dict, warmup=None,
                    timeout: float = 1800, record: str | None = "suffix") -> dict:
    """The job of this module in vLLM's environment (engine core in-process, fp32, greedy):
    ``{"requests": [{"tokens", "steps", "seconds", "drafts"}, ...], "startup_s", "total_s",
    "vllm_version", "arctic_inference"}`` (steps: see :func:`recount`; drafts: ``[output tokens so
    far, draft ids]`` per draft). warmup: token ids of a request served first, its counters left out.
    record: whose drafts to write down (:func:`_record_vllm_drafts`: "suffix", "eagle", "medusa", None).
    Any speculative method runs; only the draft recording depends on it."""
    import os
    import subprocess
    import tempfile

    from . import vllm_runner as V

    ids = V._check_job(model_dir, prompts, max_tokens, 2048, speculative_config, "run_vllm_stream")
    ok, why = V.vllm_available()
    if not ok:
        raise RuntimeError(why)
    job = {"model": str(model_dir), "prompts": ids, "max_tokens": int(max_tokens), "dtype": "float32", "seed": 0,
           "speculative_config": speculative_config, "max_model_len": 2048, "in_process": True,
           "job_script": str(V.JOB_SCRIPT), "record": record,
           "warmup": None if warmup is None else [int(t) for t in (warmup.tolist() if hasattr(warmup, "tolist")
                                                                   else warmup)]}
    py = V.vllm_python()
    with tempfile.TemporaryDirectory(prefix="specdecode-suffix-") as tmp:
        job_path, result_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        try:
            proc = subprocess.run([str(py), str(Path(__file__).resolve()), "--vllm-job", job_path, result_path],
                                  capture_output=True, text=True, timeout=timeout, env=V._job_env(py, in_process=True),
                                  cwd=tmp)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the vLLM suffix job did not finish in {timeout} s") from None
        if proc.returncode != 0 or not os.path.exists(result_path):
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) or "(no output)"
            raise RuntimeError(f"the vLLM suffix job failed (exit {proc.returncode}):\n{tail}")
        with open(result_path) as f:
            return json.load(f)


def recount(steps: list, max_tokens: int) -> dict:
    """vLLM's per-step counters of one request, as reported and cut to max_tokens.

    steps: ``[draft tokens, accepted, drafts, new tokens, tokens before]`` per engine step. A step
    that starts with ``before`` tokens can emit at most ``max_tokens - before`` of them, one being
    the target's own, so at most ``max_tokens - before - 1`` drafted tokens count, as our engine
    cuts its drafts. ``tail_cached``: tokens vLLM's worker added to the suffix cache past the
    request's output (accepted + 1 at the last step, minus what was emitted)."""
    raw = {c: 0 for c in COUNTERS}
    within = {c: 0 for c in COUNTERS}
    for d, a, n, _, before in steps:
        raw["draft_tokens"] += d
        raw["accepted"] += a
        raw["drafts"] += n
        cap = max(0, max_tokens - before - 1)
        within["draft_tokens"] += min(d, cap)
        within["accepted"] += min(a, cap)
        within["drafts"] += int(min(d, cap) > 0)
    tail = 0
    if steps:
        d, a, _, emitted, _ = steps[-1]
        tail = max(0, a + 1 - emitted) if d else 0
    return {"vllm": raw, "vllm_within": within, "tail_cached": tail}


def steps_within(steps: list, max_tokens: int) -> list:
    """vLLM's verification steps of one request as ``(drafted, accepted)`` pairs cut to max_tokens,
    as our engine counts them (the prefill step, which verifies nothing, left out)."""
    return [(min(d, max(0, max_tokens - b - 1)), min(a, max(0, max_tokens - b - 1)))
            for d, a, _, _, b in steps if b > 0]


def first_difference(ours: list, theirs: list):
    """The first step whose (drafted, accepted) pair differs between two engines' step lists; None
    when they agree on every step (a shorter list differs where it ends)."""
    return next((j for j, (x, y) in enumerate(zip(ours, theirs)) if tuple(x) != tuple(y)),
                None if len(ours) == len(theirs) else min(len(ours), len(theirs)))


def load_stored(path, command: str) -> dict:
    """A stored comparison written by ``command``'s command line. No vLLM needed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python -m {command}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def compare_with_vllm(model, tokenizer, stream_messages: list, max_new_tokens: int = 48, settings: dict | None = None,
                      model_dir=None, vllm_warmup: bool = False, timeout: float = 1800) -> dict:
    """Decode ``stream_messages`` with vLLM's suffix method and with ours, and compare per request.

    stream_messages: items of ``workloads.load_repeating`` (``{"family", "messages"}``) or bare
    messages (a string or a list of {role, content}), in arrival order. model: the embedded model
    in fp32 (``load_model(dtype="fp32")``); model_dir: its Hugging Face directory for vLLM (default:
    the embedded model's). settings: see :func:`suffix_settings`. vllm_warmup: serve the stream's
    first prompt once before the stream, as ``vllm_job`` does (its response then sits in vLLM's
    global tree and not in ours), to show what that does to the counters.

    Returns ``{"meta", "rows", "totals"}`` (JSON-ready): a row per request with family, prompt and
    output lengths, ``same_output`` (vLLM's ids == ours), ``ours_plain`` / ``vllm_plain`` (each
    equals plain greedy decoding of our engine), the counters of each side in :data:`SIDES`
    (``<side>_drafts``, ``_draft_tokens``, ``_accepted``), ``vllm_tail_cached``,
    ``first_step_differs`` (None: every step agrees after recounting), ``drafts_compared`` /
    ``drafts_differ`` / ``draft_differences`` (``[output tokens so far, our draft, vLLM's]`` where
    the draft ids differ, both cut to the budget) and both per-step lists.
    """
    from .. import chat_ids
    from ..engine import autoregressive_generate, generate
    from ..measure.harness.protocol import untimed
    from ..models import EMBEDDED, cache_dir
    from ..proposers import load_proposer

    ours_kwargs, config = suffix_settings(settings)
    items = [s if isinstance(s, dict) and "messages" in s else {"family": None, "messages": s}
             for s in stream_messages]
    if not items:
        raise ValueError("stream_messages is empty")
    prompts = [chat_ids(tokenizer, it["messages"]) for it in items]
    model_dir = cache_dir() / EMBEDDED if model_dir is None else model_dir

    t0 = time.perf_counter()
    served = run_vllm_stream(model_dir, prompts, max_new_tokens, config,
                             warmup=prompts[0] if vllm_warmup else None, timeout=timeout)
    vllm_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    P = load_proposer("suffix", model, **ours_kwargs)
    ours_drafts: list = []  # per step of the current request: [output tokens so far, draft ids]
    propose = P.propose

    def recording_propose(state):
        draft = propose(state)
        ours_drafts.append([len(state.token_list) - state.prompt_len, [int(t) for t in draft.tokens.tolist()]])
        return draft

    P.propose = recording_propose  # the same object all along; only its drafts are written down
    try:
        rows = []
        for i, (it, ids, theirs) in enumerate(zip(items, prompts, served["requests"])):
            ours_drafts.clear()
            out = generate(model, ids, proposer=P, max_new_tokens=max_new_tokens)
            plain = autoregressive_generate(model, ids, max_new_tokens=max_new_tokens).tokens.tolist()
            st, ours_tokens = out.stats, out.tokens.tolist()
            counts = recount(theirs["steps"], max_new_tokens)
            counts["ours"] = {"drafts": st.drafting_steps, "draft_tokens": st.drafted, "accepted": st.accepted}
            ours_steps = list(zip(st.draft_lengths, st.accepted_lengths))
            vllm_steps = steps_within(theirs["steps"], max_new_tokens)
            differs = first_difference(ours_steps, vllm_steps)
            row = {"request": i, "family": it.get("family"), "prompt_tokens": int(ids.numel()),
                   "new_tokens_ours": len(ours_tokens), "new_tokens_vllm": len(theirs["tokens"]),
                   "same_output": ours_tokens == theirs["tokens"], "ours_plain": ours_tokens == plain,
                   "vllm_plain": theirs["tokens"] == plain}
            for side in SIDES:
                for c in COUNTERS:
                    row[f"{side}_{c}"] = int(counts[side][c])
            theirs_at = {pos: d for pos, d in theirs.get("drafts", [])}
            draft_differences = []
            for pos, d in ours_drafts:
                cap = max(0, max_new_tokens - pos - 1)
                if pos in theirs_at and d[:cap] != theirs_at[pos][:cap]:
                    draft_differences.append([pos, d[:cap], theirs_at[pos][:cap]])
            row.update(vllm_tail_cached=counts["tail_cached"], first_step_differs=differs,
                       drafts_compared=sum(pos in theirs_at for pos, _ in ours_drafts) if theirs_at else 0,
                       drafts_differ=len(draft_differences), draft_differences=draft_differences,
                       ours_steps=[list(map(int, s)) for s in ours_steps], vllm_steps=theirs["steps"],
                       vllm_tokens=theirs["tokens"])
            rows.append(row)
    finally:
        del P.propose  # P is the plain proposer again
    ours_s = time.perf_counter() - t0

    meta = {"model": Path(str(getattr(model.config, "_name_or_path", "") or EMBEDDED)).name, "dtype": "fp32",
            "sampling": "greedy", "max_new_tokens": int(max_new_tokens), "requests": len(rows),
            "speculative_config": config, "ours": repr(P), "vllm_warmup": bool(vllm_warmup),
            "vllm_version": served.get("vllm_version"), "arctic_inference": served.get("arctic_inference"),
            "seconds": {"vllm_job": round(vllm_s, 1), "vllm_startup": round(served["startup_s"], 1),
                        "vllm_stream": round(served["total_s"], 1), "ours_with_plain": round(ours_s, 1)},
            **untimed(UNTIMED)}
    return {"meta": meta, "rows": rows, "totals": totals(rows)}


def _rates(c: dict) -> dict:
    """Mean acceptance length as vLLM defines it (1 + accepted / drafts) and acceptance rate."""
    return {"mean_acceptance_length": 1 + c["accepted"] / c["drafts"] if c["drafts"] else float("nan"),
            "acceptance_rate": c["accepted"] / c["draft_tokens"] if c["draft_tokens"] else float("nan")}


def totals(rows: list) -> dict:
    """Per side, the counters summed over ``rows`` and the two rates; also how many requests had
    equal outputs and how many agree step for step."""
    out = {}
    for side in SIDES:
        c = {k: int(sum(r[f"{side}_{k}"] for r in rows)) for k in COUNTERS}
        out[side] = dict(c, **_rates(c))
    out["requests"] = len(rows)
    out["same_output"] = int(sum(bool(r["same_output"]) for r in rows))
    out["plain_equal"] = int(sum(bool(r["ours_plain"] and r["vllm_plain"]) for r in rows))
    out["steps_agree"] = int(sum(r["first_step_differs"] is None for r in rows))
    out["vllm_tail_cached"] = int(sum(r["vllm_tail_cached"] for r in rows))
    out["drafts_compared"] = int(sum(r.get("drafts_compared", 0) for r in rows))
    out["drafts_differ"] = int(sum(r.get("drafts_differ", 0) for r in rows))
    return out


def summarize(result: dict, by: str | None = None):
    """A DataFrame, one row per side (ours, vLLM as reported, vLLM within max_tokens), and per
    ``by`` (e.g. "family") if given: drafts, draft_tokens, accepted, mean_acceptance_length,
    acceptance_rate. result: what :func:`compare_with_vllm` or :func:`load_vllm_comparison` returns."""
    import pandas as pd

    rows = result["rows"]
    groups = [(None, rows)] if by is None else [(k, [r for r in rows if r[by] == k])
                                                for k in dict.fromkeys(r[by] for r in rows)]
    out = []
    for key, g in groups:
        for side in SIDES:
            c = {k: int(sum(r[f"{side}_{k}"] for r in g)) for k in COUNTERS}
            line = {"side": SIDE_NAMES[side], "requests": len(g), **c, **_rates(c)}
            if by is not None:
                line = {by: key, **line}
            out.append(line)
    return pd.DataFrame(out)


def request_table(result: dict):
    """The per-request rows as a DataFrame without the per-step lists and token ids."""
    import pandas as pd

    drop = {"ours_steps", "vllm_steps", "vllm_tokens", "draft_differences"}
    return pd.DataFrame([{k: v for k, v in r.items() if k not in drop} for r in result["rows"]])


def load_vllm_comparison(path=None) -> dict:
    """The stored comparison (default ``data/measured/suffix_vllm.json``), as written by this
    module's command line: ``{"meta", "rows", "totals"}``. No vLLM needed."""
    return load_stored(DEFAULT_PATH if path is None else path, "specdecode_ref.serving.suffix_vllm")


def main(argv=None) -> dict:
    import argparse
    import datetime
    import shlex

    parser = argparse.ArgumentParser(prog="python -m specdecode_ref.serving.suffix_vllm",
                                     description="Our suffix decoding beside vLLM's, request by request.")
    parser.add_argument("--per-family", type=int, default=2, help="requests per family of the repeating stream")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default=str(DEFAULT_PATH), help="where the JSON goes")
    parser.add_argument("--vllm-warmup", action="store_true",
                        help="serve the first prompt once before the stream, as vllm_job does")
    args = parser.parse_args(argv)

    from .. import load_model
    from ..measure.harness.claims import cpu_name
    from ..measure.harness.workloads import load_repeating

    t0 = time.perf_counter()
    model, tok = load_model(dtype="fp32", device="cpu")
    stream = load_repeating(per_family=args.per_family)
    result = compare_with_vllm(model, tok, stream, max_new_tokens=args.max_new_tokens, vllm_warmup=args.vllm_warmup)
    import torch

    result["meta"].update(
        cpu=cpu_name(), torch=torch.__version__, torch_threads=torch.get_num_threads(),
        date=datetime.date.today().isoformat(), per_family=args.per_family,
        command="python -m specdecode_ref.serving.suffix_vllm " + " ".join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)))
    result["meta"]["seconds"]["command"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(request_table(result).drop(columns=["prompt_tokens"]).to_string(index=False))
    print(summarize(result).to_string(index=False))
    print(f"written to {out} in {result['meta']['seconds']['command']} s")
    return result


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--vllm-job":  # inside vLLM's environment
        sys.path.pop(0)  # this file's folder: its modules must not shadow any of vLLM's imports
        with open(sys.argv[2]) as f:
            _job = json.load(f)
        _result = _vllm_job(_job)
        with open(sys.argv[3], "w") as f:
            json.dump(_result, f)
    else:
        main()
