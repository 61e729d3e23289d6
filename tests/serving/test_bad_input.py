"""The serving APIs refuse bad input with a clear error naming the argument (and the request or
row): the scheduler and its budgets, policy names, the sweep (function and CLI), the vLLM runner."""
import re
import sys

import pytest
import torch

from specdecode_ref.proposers import NgramProposer
from specdecode_ref.proposers.draft_model import DraftModelProposer
from specdecode_ref.sampling import SamplingParams
from specdecode_ref.serving import sweep
from specdecode_ref.serving import vllm_runner as V
from specdecode_ref.serving.policies import AlwaysOn, make_policy
from specdecode_ref.serving.scheduler import Scheduler, serve
from support import make_tiny_llama

OK = torch.tensor([1, 2, 3])

SCHEDULER_CASES = {
    "num_blocks 0": (dict(num_blocks=0), ValueError, "num_blocks must be an int >= 1, got 0"),
    "block_size negative": (dict(block_size=-4), ValueError, "block_size must be an int >= 1, got -4"),
    "max_num_batched_tokens 0": (dict(max_num_batched_tokens=0), ValueError, "max_num_batched_tokens must be an int >= 1"),
    "max_num_seqs negative": (dict(max_num_seqs=-1), ValueError, "max_num_seqs must be an int >= 1, got -1"),
    "max_num_seqs bool": (dict(max_num_seqs=True), ValueError, "max_num_seqs must be an int >= 1, got True"),
    "max_num_seqs float": (dict(max_num_seqs=2.5), ValueError, "max_num_seqs must be an int >= 1, got 2.5"),
    "compact_fraction NaN": (dict(compact_fraction=float("nan")), ValueError, "compact_fraction must be a number in"),
    "policy given by name": (dict(proposer=NgramProposer(k=2), policy="adaptive"), TypeError,
                             "policy must be a SpeculationPolicy .*make_policy"),
    "policy drafts more than the proposer": (dict(proposer=NgramProposer(k=2), policy=AlwaysOn(4)), ValueError,
                                             "more drafts than the proposer's k=2"),
    "drafting policy without proposer": (dict(policy=AlwaysOn(2)), ValueError, "no proposer was given"),
    "sampling not SamplingParams": (dict(sampling={"temperature": 1}), TypeError, "sampling must be a SamplingParams"),
    "proposer not a Proposer": (dict(proposer="ngram"), TypeError, "proposer must be a specdecode_ref.proposers"),
    "seed a float": (dict(seed=1.5), ValueError, "seed must be an int, got 1.5"),
}


@pytest.mark.parametrize("case", list(SCHEDULER_CASES))
def test_scheduler_refuses_bad_settings(tiny_model, case):
    kwargs, error, message = SCHEDULER_CASES[case]
    with pytest.raises(error, match=message):
        Scheduler(tiny_model, **kwargs)


def test_scheduler_refuses_a_draft_model_for_another_target(tiny_model):
    other = make_tiny_llama(vocab_size=80, layers=1)
    with pytest.raises(ValueError, match="the draft model has a vocabulary of 80 tokens .* the target has 64"):
        Scheduler(tiny_model, DraftModelProposer(other, k=2))
    with pytest.raises(ValueError, match="the draft model is on meta but the target is on cpu"):
        Scheduler(tiny_model, DraftModelProposer(make_tiny_llama(layers=1).to("meta"), k=2))


ADD_CASES = {
    "empty prompt": (dict(prompt=torch.tensor([], dtype=torch.long)), ValueError, "request 1: the prompt is empty"),
    "float prompt": (dict(prompt=torch.tensor([1.0, 2.0])), ValueError, "request 1: .*integer token ids"),
    "2-D prompt": (dict(prompt=torch.ones(2, 3, dtype=torch.long)), ValueError, "request 1: input_ids must be 1-D"),
    "max_new_tokens 0": (dict(max_new_tokens=0), ValueError, "request 1: max_new_tokens must be an int >= 1, got 0"),
    "max_new_tokens list": (dict(max_new_tokens=[2]), ValueError, r"request 1: max_new_tokens .* got \[2\]"),
    "over the context window": (dict(prompt=torch.zeros(250, dtype=torch.long), max_new_tokens=10), ValueError,
                                "request 1: prompt of 250 tokens .* context window of 256"),
    "over the token budget": (dict(prompt=torch.zeros(60, dtype=torch.long), max_new_tokens=10), ValueError,
                              "request 1: prompt of 60 tokens .*max_num_batched_tokens=64"),
    "more blocks than the pool": (dict(prompt=torch.zeros(30, dtype=torch.long), max_new_tokens=10), ValueError,
                                  "request 1: .* needs 11 blocks of 4; the pool has 8, so it could never finish"),
    "arrival_step negative": (dict(arrival_step=-1), ValueError, "request 1: arrival_step must be an int >= 0"),
    "arrival_step a float": (dict(arrival_step=1.5), ValueError, "request 1: arrival_step must be an int >= 0, got 1.5"),
    "arrival_step a bool": (dict(arrival_step=True), ValueError, "arrival_step must be an int >= 0, got True"),
}


@pytest.mark.parametrize("case", list(ADD_CASES))
def test_add_request_refuses_what_could_never_run(tiny_model, case):
    kwargs, error, message = ADD_CASES[case]
    sched = Scheduler(tiny_model, NgramProposer(k=2), num_blocks=8, block_size=4, max_num_batched_tokens=64)
    sched.add_request(OK, 2)  # request 0 is fine
    kwargs = {"prompt": OK, "max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=message):
        sched.add_request(**kwargs)
    assert len(sched.requests) == 1  # nothing was queued


@pytest.mark.parametrize("prompts, kwargs, message", [
    ([], {}, "prompt list is empty: serve"),
    ([OK, torch.tensor([], dtype=torch.long)], {}, "request 1: the prompt is empty"),
    ([OK, OK], {"max_new_tokens": [2]}, "2 prompts but 1 max_new_tokens"),
    ([OK, OK], {"max_new_tokens": [2, -1]}, "request 1: max_new_tokens must be an int >= 1, got -1"),
    ([OK, OK], {"arrival_steps": [0, 1.5]}, "request 1: arrival_step must be an int >= 0, got 1.5"),
    ([OK, OK], {"arrival_steps": [0, "2"]}, "request 1: arrival_step must be an int >= 0, got '2'"),
])
def test_serve_refuses_bad_prompts(tiny_model, prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        serve(tiny_model, prompts, **kwargs)


def test_serve_takes_numpy_arrival_steps(tiny_model):
    import numpy as np

    result = serve(tiny_model, [OK, OK], max_new_tokens=2, arrival_steps=np.array([0, 1]))
    assert [r.arrival_step for r in result.requests] == [0, 1]


def test_bad_sampling_settings_are_refused():
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        SamplingParams(temperature=float("nan"))  # a Scheduler never sees such settings


@pytest.mark.parametrize("name, k, message", [("fast", 2, "policy must be 'on', 'off' or 'adaptive', got 'fast'"),
                                              (None, 2, "got None"), ("on", -1, "k must be an int >= 0, got -1")])
def test_make_policy_refuses_unknown_names(name, k, message):
    with pytest.raises(ValueError, match=message):
        make_policy(name, k)


SWEEP_CASES = {
    "no loads": (dict(loads=()), ValueError, "loads is empty"),
    "load 0": (dict(loads=(1, 0)), ValueError, r"loads\[1\] must be a concurrency level of at least 1"),
    "negative load": (dict(loads=(-2,)), ValueError, r"loads\[0\] .* got -2"),
    "loads as a string": (dict(loads="1,4"), TypeError, "loads must be a sequence of ints"),
    "k 0": (dict(k=0), ValueError, "k must be an int >= 1, got 0"),
    "repeats 0": (dict(repeats=0), ValueError, "repeats must be an int >= 1, got 0"),
    "unknown policy": (dict(policies=("on", "fast")), ValueError, "got 'fast'"),
    "no policies": (dict(policies=()), ValueError, "policies is empty"),
    "no prompts": (dict(prompts=[]), ValueError, "prompt list is empty: run_sweep"),
    "empty prompt": (dict(prompts=[OK, torch.tensor([], dtype=torch.long)]), ValueError, "prompt 1: the prompt is empty"),
    "max_new_tokens 0": (dict(max_new_tokens=0), ValueError, "max_new_tokens must be an int >= 1, got 0"),
    "arrival_rate negative": (dict(arrival_rate=-1.0), ValueError, "arrival_rate must be a number > 0 .* got -1.0"),
    "arrival_rate NaN": (dict(arrival_rate=float("nan")), ValueError, "arrival_rate must be a number > 0"),
    "block pool too small": (dict(num_blocks=1, block_size=2), ValueError,
                             "request 0: .* needs 3 blocks of 2; the pool has 1"),
}


@pytest.mark.parametrize("case", list(SWEEP_CASES))
def test_run_sweep_refuses_bad_arguments(tiny_model, case):
    kwargs, error, message = SWEEP_CASES[case]
    kwargs = {"prompts": [OK], "loads": (1,), "k": 2, "max_new_tokens": 2, "warmup": False, **kwargs}
    with pytest.raises(error, match=message):
        sweep.run_sweep(tiny_model, **kwargs)


def test_run_sweep_checks_every_policy_before_serving_anything(tiny_model, monkeypatch):
    """Plain decoding fits the block pool, speculation's drafts do not (6 + 2 tokens + 2 drafts in
    2 blocks of 4): the sweep refuses before the warm-up or the "off" runs, not minutes later."""
    monkeypatch.setattr(Scheduler, "run", lambda self, *a, **kw: pytest.fail("a run started before the check"))
    with pytest.raises(ValueError, match=r"request 1: a request of 6 \+ 2 tokens \(\+2 drafts\) needs 3 blocks"):
        sweep.run_sweep(tiny_model, [OK, torch.arange(6)], loads=(1,), policies=("off", "on"), k=2,
                        max_new_tokens=2, num_blocks=2, block_size=4)


@pytest.mark.parametrize("argv, message", [
    (["--out", "/nonexistent/dir/rows.csv"], "argument --out: the directory of '/nonexistent/dir/rows.csv' does not"),
    (["--loads", ""], "argument --loads: loads must be comma-separated ints"),
    (["--loads", "1,x"], "argument --loads: loads must be comma-separated ints"),
    (["--loads", "4,0"], r"argument --loads: loads\[1\] must be a concurrency level of at least 1"),
    (["--loads", "-1"], r"argument --loads: loads\[0\]"),
    (["--k", "0"], "argument --k: k must be an int >= 1, got 0"),
    (["--k", "two"], "argument --k: k must be an int >= 1, got 'two'"),
    (["--policies", "on,fast"], "argument --policies: .*got 'fast'"),
    (["--requests", "0"], "argument --requests: requests must be an int >= 1"),
    (["--max-new-tokens", "-5"], "argument --max-new-tokens: max_new_tokens must be an int >= 1"),
    (["--repeats", "0"], "argument --repeats: repeats must be an int >= 1"),
    (["--num-blocks", "0"], "argument --num-blocks: num_blocks must be an int >= 1"),
    (["--block-size", "0"], "argument --block-size: block_size must be an int >= 1"),
    (["--threads", "0"], "argument --threads: threads must be an int >= 1"),
    (["--arrival-rate", "nan"], "argument --arrival-rate: arrival_rate must be > 0"),
    (["--knee", "0"], "argument --knee: knee must be > 0"),
])
def test_sweep_cli_refuses_bad_options_before_loading_the_model(monkeypatch, capsys, argv, message):
    import specdecode_ref.models as models

    monkeypatch.setattr(models, "load_model", lambda **kw: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(argv)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["--num-blocks", "1", "--block-size", "2"], "request 0: .* needs .* blocks of 2; the pool has 1"),
    (["--max-new-tokens", "300"], "prompt 0: prompt of 3 tokens \\+ max_new_tokens=300 exceeds .* context window"),
])
def test_sweep_cli_refuses_settings_that_cannot_serve_the_prompts_before_measuring(
        tiny_model, monkeypatch, capsys, argv, message):
    """Settings that only fail together with the prompts (the block pool, the context window) are a
    usage error as soon as the prompts exist, before the cost surface is measured."""
    import specdecode_ref.measure.batch_bench as bench
    import specdecode_ref.models as models

    monkeypatch.setattr(models, "load_model", lambda **kw: (tiny_model, None))
    monkeypatch.setattr(bench, "prompt_pool", lambda tok, pool: [OK, torch.arange(5)])
    monkeypatch.setattr(bench, "measure_cost_surface", lambda *a, **kw: pytest.fail("the cost surface was measured"))
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--requests", "2", *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_sweep_cli_defaults_parse():
    args = sweep.build_parser().parse_args([])
    assert args.loads == [1, 4, 16] and args.policies == ["off", "on", "adaptive"] and args.k == 4


# --- the vLLM runner: refused before vLLM starts ------------------------------------------------

VLLM_CASES = {
    "no prompts": (dict(prompts=[]), ValueError, "prompt list is empty: run_vllm"),
    "empty prompt": (dict(prompts=[[1, 2], []]), ValueError, "prompt 1: the prompt is empty"),
    "float prompt": (dict(prompts=[[1.5, 2.0]]), ValueError, "prompt 0: .*integer token ids"),
    "max_tokens 0": (dict(max_tokens=0), ValueError, "max_tokens must be an int >= 1, got 0"),
    "over max_model_len": (dict(prompts=[[1, 2], list(range(30))], max_tokens=4, max_model_len=32), ValueError,
                           "prompt 1: prompt of 30 tokens \\+ max_tokens=4 exceeds max_model_len=32"),
    "temperature NaN": (dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
    "temperature negative": (dict(temperature=-1.0), ValueError, "temperature must be a finite number"),
    "top_p 0": (dict(top_p=0.0), ValueError, "top_p must be in"),
    "speculative k 0": (dict(speculative_config=V.ngram_config(k=0)), ValueError, "num_speculative_tokens must be"),
    "speculative config not a dict": (dict(speculative_config="ngram"), TypeError, "speculative_config must be a dict"),
    "dtype unknown": (dict(dtype="fp16"), ValueError, r"dtype must be one of \['bf16', 'bfloat16', 'float32', 'fp32'\]"),
    "seed a float": (dict(seed=1.5), ValueError, "seed must be an int, got 1.5"),
    "timeout 0": (dict(timeout=0), ValueError, "timeout must be a number of seconds > 0, got 0"),
    "timeout NaN": (dict(timeout=float("nan")), ValueError, "timeout must be a number of seconds > 0, got nan"),
    "missing model directory": (dict(model_dir="/nonexistent/model"), ValueError,
                                "model_dir '/nonexistent/model' is not a directory"),
    "missing draft model directory": (dict(speculative_config=V.draft_model_config("/nonexistent/draft")), ValueError,
                                      "speculative_config's model '/nonexistent/draft' is not a directory"),
}


@pytest.mark.parametrize("case", list(VLLM_CASES))
def test_run_vllm_refuses_bad_arguments(monkeypatch, tmp_path, case):
    kwargs, error, message = VLLM_CASES[case]
    monkeypatch.setattr(V, "vllm_available", lambda: pytest.fail("vLLM was asked for"))
    kwargs = {"model_dir": tmp_path, "prompts": [[1, 2, 3]], "max_tokens": 4, **kwargs}
    with pytest.raises(error, match=message):
        V.run_vllm(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(loads=()), "loads is empty"), (dict(loads=(1, 0)), r"loads\[1\]"),
    (dict(max_tokens=-1), "max_tokens must be an int >= 1"), (dict(model_dir="/nonexistent"), "not a directory"),
    (dict(repeats=0), "repeats must be an int of at least 1"),
])
def test_run_vllm_sweep_refuses_bad_arguments(monkeypatch, tmp_path, kwargs, message):
    monkeypatch.setattr(V, "vllm_available", lambda: pytest.fail("vLLM was asked for"))
    kwargs = {"model_dir": tmp_path, "prompts": [[1, 2, 3]], "max_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        V.run_vllm_sweep(**kwargs)


@pytest.mark.parametrize("dtype, sent", [("fp32", "float32"), ("bf16", "bfloat16"), ("float32", "float32")])
def test_run_vllm_sends_vllm_its_own_dtype_names(monkeypatch, tmp_path, dtype, sent):
    """The course's dtype names ("fp32", "bf16", as run_vllm_sweep takes them) reach vLLM under
    its own names; vLLM would refuse "fp32" only after its start-up."""
    jobs = []
    monkeypatch.setattr(V, "vllm_available", lambda: (True, "test"))
    monkeypatch.setattr(V, "_run_job", lambda job, timeout: jobs.append(job) or {})
    V.run_vllm(tmp_path, [[1, 2, 3]], max_tokens=4, dtype=dtype)
    assert jobs[0]["dtype"] == sent


def _broken(tmp_path, kind):
    if kind == "exits 0 without vLLM":
        return "/bin/true"
    if kind == "a directory":
        return str(tmp_path)
    if kind == "not executable":
        path = tmp_path / "python"
        path.write_text("not a program")
        return str(path)
    return sys.executable  # a Python without vllm


@pytest.mark.parametrize("kind, message", [
    ("exits 0 without vLLM", "printed no version .*not a Python with vLLM"),
    ("a directory", "cannot run .* as vLLM's Python"),
    ("not executable", "cannot run .* as vLLM's Python"),
    ("a Python without vllm", "`import vllm` fails in .*No module named 'vllm'"),
])
def test_broken_vllm_interpreter_says_what_failed_and_how_to_build_it(monkeypatch, tmp_path, kind, message):
    monkeypatch.setenv(V.VLLM_PYTHON_ENV, _broken(tmp_path, kind))
    ok, why = V.vllm_available()
    assert not ok
    with pytest.raises(RuntimeError, match=f"{message}.*make vllm-env"):
        V.run_vllm(tmp_path, [[1, 2, 3]], max_tokens=4)
