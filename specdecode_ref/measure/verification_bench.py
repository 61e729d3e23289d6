"""Token-by-token against block verification on the real model (notebook 11).

Block verification (verify.block_verify) can only differ from the token rule where the drafter
reports a q that is not one-hot: the draft model, early exit, an EAGLE chain, and a Medusa chain
drafting with ``draft_sampling="sample"``. For each such drafter and temperature, every
prompt is decoded with both rules under the same seeds, the two runs interleaved, and τ and
tokens/s are compared prompt by prompt (``claims.compare_paired``: a geometric-mean ratio with a
bootstrap interval over prompts).

Counterparts: vLLM's block rule in its Model Runner V2 rejection sampler,
``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py`` (``_compute_cumulative_log_p_kernel``:
the prefix weights in log space; ``_compute_local_residual_mass_kernel``: the residual masses;
vllm-project/vllm#46781; an opt-in ``verify_method="block"`` for the V1 sampler is proposed in
#40819, falling back to the token rule for drafters without probabilities, n-gram and suffix);
SGLang's ``chain_block_speculative_sampling_triton`` (``sglang/kernels/ops/speculative/reject_sampling.py``).
"""
from __future__ import annotations

from ..engine import generate
from ..sampling import SamplingParams
from .claims import compare_paired

#: Drafters whose drafts carry a sampled q, with the options that make them sample. (Hydra's chain
#: drafts greedily only: its heads read the tokens drafted before them, and sampling them is not
#: offered, so its q is one-hot and both rules keep the same number of tokens in expectation.)
DRAFTERS_WITH_Q = {"draft": {}, "early-exit": {}, "eagle": {}, "medusa-chain": {"draft_sampling": "sample"}}
RULES = ("token", "block")


def run_verification_comparison(model, prompts: list, drafters=None, temperatures=(0.7, 1.0),
                                max_new_tokens: int = 48, seeds=(0,), progress: bool = True):
    """Decode every prompt (1-D LongTensors) with each drafter at each temperature, once per rule
    and seed, the two rules back to back. drafters: name -> load_proposer options (default
    :data:`DRAFTERS_WITH_Q`). Returns a DataFrame, one row per (drafter, temperature, prompt, seed,
    rule): tau, accepted, drafted, steps, new_tokens, wall_s, tokens_per_s."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..proposers import load_proposer

    drafters = DRAFTERS_WITH_Q if drafters is None else drafters
    jobs = [(name, t, i, s) for name in drafters for t in temperatures for i in range(len(prompts)) for s in seeds]
    rows, made = [], {}
    for name, t, i, s in tqdm(jobs, desc="token vs block", disable=not progress):
        if name not in made:
            made[name] = load_proposer(name, model, **drafters[name])
        sampling = SamplingParams(temperature=t)
        for rule in RULES:
            out = generate(model, prompts[i], made[name], max_new_tokens=max_new_tokens, sampling=sampling, seed=s,
                           verification=rule)
            st = out.stats
            rows.append({"drafter": name, "temperature": t, "prompt": i, "seed": s, "rule": rule, "tau": st.tau,
                         "accepted": st.accepted, "drafted": st.drafted, "steps": st.steps,
                         "new_tokens": st.new_tokens, "wall_s": st.wall_time_s, "tokens_per_s": st.tokens_per_s})
    return pd.DataFrame(rows)


def summarize_verification(df):
    """Per (drafter, temperature): mean τ of each rule, and block against token on τ and on
    tokens/s, paired over prompts (seeds averaged per prompt), each a claims.Comparison."""
    import pandas as pd

    out = []
    for (name, t), g in df.groupby(["drafter", "temperature"], sort=False):
        per = g.groupby(["prompt", "rule"])[["tau", "tokens_per_s"]].mean().unstack("rule")
        out.append({"drafter": name, "temperature": t, "tau_token": per["tau"]["token"].mean(),
                    "tau_block": per["tau"]["block"].mean(),
                    "tau": compare_paired(per["tau"]["block"], per["tau"]["token"], tolerance=0.0),
                    "speed": compare_paired(per["tokens_per_s"]["block"], per["tokens_per_s"]["token"])})
    return pd.DataFrame(out)
