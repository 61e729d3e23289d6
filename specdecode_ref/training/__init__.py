"""Training the drafters on the target's own answers (self-distillation).

    distill   the corpus: the target's answers, its top-k logits and hidden states
    train     the training loop and one recipe per drafter family; the command line
              (``python -m specdecode_ref.training --help``)
"""
