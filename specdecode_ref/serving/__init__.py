"""Serving: speculative decoding inside an engine that serves many requests.

    vllm_runner   run vLLM (in its own environment) on the same model and prompts, JSON in and out
    export        our trained drafters as model directories vLLM loads (draft model, EAGLE head)
"""
