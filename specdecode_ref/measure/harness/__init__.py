"""The timing harness: how every study in ``measure`` and every notebook takes a time, puts an
interval on it and turns it into a sentence. A newcomer who wants to know how a figure in the
course was measured starts at ``protocol``.

    protocol        the one timing protocol: interleaved rounds in alternating order, spikes re-timed,
                    the quiet check and T(1) recorded with every table, tables compared or refused
    timing          median-of-runs timing, decode rates, cost curves T(n), the quiet-machine check
    compare         interleaved runs of several proposers on the same prompts, per-method tables, one step probed
    bench           every method on the same prompts vs Hugging Face (``python -m specdecode_ref.measure.harness.bench``)
    intervals       paired, stratified bootstrap intervals on speedup and tau; time per output token percentiles
    claims          sentences rendered from measured values: verdicts that follow their intervals, the machine line
    stats           chi-square and uniformity tests for "the output follows the target distribution"
    workloads       the benchmark's prompts by category, a held-out set, the disjoint training prompts, a stream
    run_size        one switch for the notebooks' experiment sizes: full (committed outputs) or small (make test)
"""
