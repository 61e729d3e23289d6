"""Lab 6 grading tests (visible): the checks the notebook walks you through.

Run them with ``python -m specdecode_ref.grading labs/lab06_batched_verify --visible-only``
(your student.py) or add ``--reference``.
"""
import torch

from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)
REFERENCE_PATTERNS = [r"specdecode_ref\.batch\b[^\n]*|from specdecode_ref import[^\n]*\bbatch\b"]

MIN = torch.finfo(torch.float32).min


def as_lists(x):
    return [[int(v) for v in row] for row in (x.tolist() if isinstance(x, torch.Tensor) else x)]


def tiny_llama(seed=0, attn="sdpa"):
    """A 2-layer random Llama (vocabulary 64): fast enough for many forwards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation(attn)
    return model


class Batch:
    """A padded cache driven by the lab's functions: the engine's bookkeeping, spelled out."""

    def __init__(self, lab, model, rows):
        from transformers import DynamicCache

        self.lab, self.model = lab, model
        self.cache = DynamicCache()
        self.slot_pos = torch.empty(rows, 0, dtype=torch.long)
        self.lengths = [0] * rows
        self.text = [[] for _ in range(rows)]  # what each row's cache holds, as plain token lists

    @torch.no_grad()
    def forward(self, rows_ids):
        ids, qpos = self.lab.step_layout(rows_ids, self.lengths, 0)
        ids, qpos = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(qpos, dtype=torch.long)
        self.slot_pos = torch.cat([self.slot_pos, qpos], 1)
        mask = torch.as_tensor(self.lab.ragged_attention_mask(self.slot_pos, qpos, torch.float32))
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=qpos.clamp(min=0),
                         past_key_values=self.cache, use_cache=True).logits
        for b, row in enumerate(rows_ids):
            self.lengths[b] += len(row)
            self.text[b] = self.text[b] + list(row)
        return out

    def rollback(self, keep):
        self.slot_pos = torch.as_tensor(self.lab.rollback(self.slot_pos.clone(), list(keep)), dtype=torch.long)
        self.lengths = list(keep)
        self.text = [t[:k] for t, k in zip(self.text, keep)]

    def check(self, logits, rows_ids, what):
        """Each row's new columns equal a fresh forward of that row's text alone."""
        n = logits.shape[1]
        for b, row in enumerate(rows_ids):
            if not row:
                continue
            with torch.no_grad():
                fresh = self.model(input_ids=torch.tensor([self.text[b]])).logits[0, -len(row):]
            diff = float((logits[b, n - len(row):] - fresh).abs().max())
            assert diff < 1e-4, (f"{what}: row {b}'s logits differ from running that row alone by {diff:.3g} "
                                 "(padding, positions or the mask)")


def argmax_logits(columns, v=8):
    """[B, N, v] logits whose argmax at [b, j] is columns[b][j]."""
    t = torch.tensor(columns)
    logits = torch.zeros(*t.shape, v)
    logits.scatter_(2, t[..., None], 5.0)
    return logits


@points(2)
def test_layout_example(lab):
    """step_layout: left padding with pad_id, positions continuing each row at its own length."""
    ids, pos = lab.step_layout([[5, 6, 7], [8], [9, 4]], [4, 0, 11], 0)
    assert as_lists(ids) == [[5, 6, 7], [0, 0, 8], [0, 9, 4]], f"ids {as_lists(ids)}"
    assert as_lists(pos) == [[4, 5, 6], [-1, -1, 0], [-1, 11, 12]], f"query positions {as_lists(pos)}"
    assert torch.as_tensor(ids).dtype == torch.long and torch.as_tensor(pos).dtype == torch.long


@points(2)
def test_mask_example(lab):
    """ragged_attention_mask: each query sees its own row's slots with 0 <= position <= its own."""
    slot_pos = torch.tensor([[0, 1, 2, -1, 3, 4],     # a rejected draft left a hole at slot 3
                             [-1, -1, 0, 1, -1, 2]])  # left padding, a hole, a padded query slot
    query_pos = torch.tensor([[3, 4], [-1, 2]])
    m = lab.ragged_attention_mask(slot_pos, query_pos, torch.float32)
    assert tuple(m.shape) == (2, 1, 2, 6), f"shape {tuple(m.shape)}, want [B, 1, N, S] = (2, 1, 2, 6)"
    visible = m[:, 0] == 0
    want_real = torch.tensor([[[1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 1, 1]],
                              [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 1]]], dtype=torch.bool)
    for b, j in [(0, 0), (0, 1), (1, 1)]:
        assert torch.equal(visible[b, j], want_real[b, j]), (
            f"row {b}, query {j} (position {int(query_pos[b, j])}): visible {visible[b, j].int().tolist()}, "
            f"want {want_real[b, j].int().tolist()}")
    assert visible[1, 0].any(), "a padding query must see at least one slot (its own)"
    assert (m[~(m == 0)] == MIN).all(), "hidden entries must be torch.finfo(dtype).min"


@points(3)
def test_batched_forward_equals_rows_alone(lab):
    """Prefill three prompts of different lengths, then a step with drafts of different lengths:
    with your layout and mask, every row's logits equal that row run alone."""
    model = tiny_llama()
    batch = Batch(lab, model, 3)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 4], [7, 7, 7, 7, 7]]
    batch.check(batch.forward(prompts), prompts, "prefill")
    step = [[10, 11, 12], [13], [14, 15]]
    batch.check(batch.forward(step), step, "a step with drafts of different lengths")


@points(2)
def test_verify_rows_examples(lab):
    """verify_rows: each row reads its own last len + 1 columns; all, none and an empty draft."""
    columns = [[3, 4, 5, 6],   # row 0: drafts [3, 4, 5] all correct, then 6 (bonus)
               [2, 2, 7, 1],   # row 1: draft [2] in the last two columns; the target says 7
               [2, 2, 2, 4]]   # row 2: no draft; the target's token is 4
    emitted, accepted = lab.verify_rows(argmax_logits(columns), [[3, 4, 5], [2], []])
    assert [list(map(int, e)) for e in emitted] == [[3, 4, 5, 6], [7], [4]], f"emitted {emitted}"
    assert list(map(int, accepted)) == [3, 0, 0], f"num_accepted {accepted}"


@points(1)
def test_rollback_example(lab):
    """rollback: every row back to its own length; later slots become -1."""
    slot_pos = torch.tensor([[0, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 3, -1], [0, -1, 1, 2, 3, 4]])
    out = lab.rollback(slot_pos.clone(), [6, 2, 3])
    assert as_lists(out) == [[0, 1, 2, 3, 4, 5], [-1, 0, 1, -1, -1, -1], [0, -1, 1, 2, -1, -1]], as_lists(out)


@points(1)
def test_compaction_example(lab):
    """compaction_index: live slots in position order at the end of each row."""
    slot_pos = torch.tensor([[0, 1, -1, 2, -1, 3], [-1, 0, -1, -1, 1, -1]])
    index, new_pos = lab.compaction_index(slot_pos)
    assert as_lists(new_pos) == [[0, 1, 2, 3], [-1, -1, 0, 1]], f"new slot_pos {as_lists(new_pos)}"
    index = torch.as_tensor(index)
    assert index[0].tolist() == [0, 1, 3, 5] and index[1, 2:].tolist() == [1, 4], f"index {as_lists(index)}"
