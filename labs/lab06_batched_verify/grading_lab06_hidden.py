"""Lab 6 grading tests (hidden): edge cases, random cases against brute force, rollback with
holes inside a real forward, another attention back-end and dtype, and your five functions
driving the course's batched engine."""
import pytest
import torch

from grading_lab06 import MIN, Batch, argmax_logits, as_lists, tiny_llama
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


def brute_visible(slot_pos, query_pos):
    b, s = slot_pos.shape
    n = query_pos.shape[1]
    want = torch.zeros(b, n, s, dtype=torch.bool)
    for r in range(b):
        for j in range(n):
            p = int(query_pos[r, j])
            for c in range(s):
                want[r, j, c] = p >= 0 and 0 <= int(slot_pos[r, c]) <= p
    return want


def random_slots(g, b, s):
    """Random slot positions: each row a permutation-free ascending run of live positions with holes."""
    out = torch.full((b, s), -1, dtype=torch.long)
    for r in range(b):
        live = torch.rand(s, generator=g) < 0.6
        out[r, live] = torch.arange(int(live.sum()))
    return out


@points(1)
def test_layout_edge_cases(lab):
    """step_layout: one row, an empty row, rows given as tuples or tensors, a custom pad id."""
    ids, pos = lab.step_layout([[4, 2]], [7], 0)
    assert as_lists(ids) == [[4, 2]] and as_lists(pos) == [[7, 8]]
    ids, pos = lab.step_layout([(1, 2), [], torch.tensor([3])], [0, 5, 2], 9)
    assert as_lists(ids) == [[1, 2], [9, 9], [9, 3]] and as_lists(pos) == [[0, 1], [-1, -1], [-1, 2]]


@points(2)
def test_mask_random_bruteforce(lab):
    """ragged_attention_mask on 100 random layouts against the rule, padding queries non-empty."""
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        b, s0, n = (int(x) for x in torch.randint(1, 6, (3,), generator=g))
        old = random_slots(g, b, s0)
        lengths = [int(old[r].max()) + 1 for r in range(b)]
        counts = torch.randint(0, n + 1, (b,), generator=g).tolist()
        counts[0] = n
        qpos = torch.full((b, n), -1, dtype=torch.long)
        for r, c in enumerate(counts):
            if c:
                qpos[r, n - c:] = torch.arange(lengths[r], lengths[r] + c)
        slot_pos = torch.cat([old, qpos], 1)
        m = lab.ragged_attention_mask(slot_pos, qpos, torch.float32)
        visible = m[:, 0] == 0
        want = brute_visible(slot_pos, qpos)
        real = qpos >= 0
        assert torch.equal(visible[real], want[real]), f"slot_pos {slot_pos.tolist()}, query_pos {qpos.tolist()}"
        assert visible.any(-1).all(), "every query (padding included) must see at least one slot"
        assert (m[~(m == 0)] == MIN).all()


@points(1)
def test_mask_dtype(lab):
    """The mask comes in the dtype asked for, hidden entries at that dtype's finfo.min."""
    slot_pos, qpos = torch.tensor([[0, 1, -1, 2]]), torch.tensor([[2]])
    m = lab.ragged_attention_mask(slot_pos, qpos, torch.bfloat16)
    assert m.dtype == torch.bfloat16 and tuple(m.shape) == (1, 1, 1, 4)
    assert (m[0, 0, 0] == torch.tensor([0, 0, torch.finfo(torch.bfloat16).min, 0], dtype=torch.bfloat16)).all()


@points(3)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rollback_holes_in_a_real_forward(lab, attn):
    """Prefill, a step, per-row rollback (keep one, none, two drafts), another step: rows still
    equal running each row's committed text alone (both attention back-ends)."""
    model = tiny_llama(seed=3, attn=attn)
    batch = Batch(lab, model, 3)
    prompts = [[5, 6], [1, 2, 3, 4, 5, 6, 7], [9, 9, 9, 1]]
    batch.forward(prompts)
    step = [[10, 11, 12, 13], [14, 15], [16, 17, 18]]
    batch.forward(step)
    batch.rollback([len(p) + k for p, k in zip(prompts, (2, 1, 3))])
    step = [[20], [21, 22, 23], [24, 25]]
    batch.check(batch.forward(step), step, "after a per-row rollback")
    batch.rollback([batch.lengths[0] - 1, batch.lengths[1] - 3, batch.lengths[2]])
    step = [[30, 31], [32], [33]]
    batch.check(batch.forward(step), step, "after a second rollback")


@points(2)
def test_verify_rows_random_bruteforce(lab):
    """verify_rows on 200 random batches against a per-row loop."""
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        b = int(torch.randint(1, 5, (1,), generator=g))
        lens = torch.randint(0, 5, (b,), generator=g).tolist()
        n = max(lens) + 1
        cols = torch.randint(0, 3, (b, n), generator=g)
        drafts = [torch.randint(0, 3, (k,), generator=g).tolist() for k in lens]
        emitted, accepted = lab.verify_rows(argmax_logits(cols.tolist(), v=3), drafts)
        for r, d in enumerate(drafts):
            mine = cols[r, n - len(d) - 1:].tolist()
            a = 0
            while a < len(d) and d[a] == mine[a]:
                a += 1
            assert int(accepted[r]) == a and [int(x) for x in emitted[r]] == d[:a] + [mine[a]], (
                f"row {r}: columns {cols[r].tolist()}, draft {d}: got {emitted[r]}, {accepted[r]}")


@points(1)
def test_rollback_edges_and_no_mutation(lab):
    """keep = length removes nothing, keep = 0 empties the row, and the argument is not modified."""
    slot_pos = torch.tensor([[0, 1, 2, -1], [-1, 0, 1, 2]])
    before = slot_pos.clone()
    out = lab.rollback(slot_pos, [3, 0])
    assert as_lists(out) == [[0, 1, 2, -1], [-1, -1, -1, -1]]
    assert torch.equal(slot_pos, before), "rollback must return a new tensor and leave its argument alone"


@points(2)
def test_compaction_random(lab):
    """compaction_index on random layouts: width, order, and the index points at the right slots."""
    g = torch.Generator().manual_seed(2)
    for _ in range(100):
        b, s = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        slot_pos = random_slots(g, b, s)
        slot_pos = slot_pos[:, torch.randperm(s, generator=g)]  # slots need not be in position order
        if not (slot_pos >= 0).any():
            continue
        index, new_pos = (torch.as_tensor(x) for x in lab.compaction_index(slot_pos))
        counts = (slot_pos >= 0).sum(1)
        w = int(counts.max())
        assert tuple(new_pos.shape) == (b, w) and tuple(index.shape) == (b, w)
        for r in range(b):
            c = int(counts[r])
            assert new_pos[r, : w - c].eq(-1).all() and new_pos[r, w - c:].tolist() == list(range(c)), new_pos[r]
            assert slot_pos[r, index[r, w - c:]].tolist() == list(range(c)), "index must point at the live slots"
            assert ((index[r] >= 0) & (index[r] < s)).all()


@points(4)
def test_your_functions_drive_the_engine(lab, monkeypatch):
    """Your five functions inside generate_batch (rows of different lengths, ragged acceptance,
    rows finishing early, frequent compaction): every row equals plain greedy decoding alone."""
    import specdecode_ref.batch as engine
    import specdecode_ref.ragged_cache as cache
    from specdecode_ref import autoregressive_generate, generate_batch
    from specdecode_ref.proposers import Draft, Proposer

    monkeypatch.setattr(cache, "left_pad_layout", lambda rows, lengths, pad=0, device=None: tuple(
        torch.as_tensor(x, dtype=torch.long).to(device) for x in lab.step_layout(rows, lengths, pad)))
    monkeypatch.setattr(cache, "ragged_attention_mask", lambda s, q, dtype: torch.as_tensor(
        lab.ragged_attention_mask(s, q, dtype)))
    monkeypatch.setattr(engine, "greedy_verify_rows", lambda logits, drafts: (
        lambda e, a: ([[int(t) for t in r] for r in e], [int(x) for x in a]))(*lab.verify_rows(logits, drafts)))
    monkeypatch.setattr(cache, "rollback_slot_positions", lambda s, keep: torch.as_tensor(
        lab.rollback(s.clone(), list(keep)), dtype=torch.long))
    monkeypatch.setattr(cache, "compaction_index", lambda s: tuple(
        torch.as_tensor(x, dtype=torch.long) for x in lab.compaction_index(s)))

    model = tiny_llama(seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked predictions: no near-ties
    model.generation_config.eos_token_id = None
    prompts = [torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]), torch.tensor([2, 7]), torch.tensor([1, 1, 2, 3, 5, 8])]
    budgets = [30, 12, 24]
    plain = [autoregressive_generate(model, p, max_new_tokens=m).tokens.tolist() for p, m in zip(prompts, budgets)]
    conts = {tuple(p.tolist()): c for p, c in zip(prompts, plain)}

    class Scripted(Proposer):
        """Row 0 always right, row 1 always wrong, row 2 right for a varying number of tokens."""

        def propose(self, state):
            key = tuple(state.token_list[: state.prompt_len])
            done = len(state.token_list) - state.prompt_len
            true = conts[key][done: done + self.k] + [0] * self.k
            good = {0: self.k, 1: 0}.get(list(conts).index(key), done % (self.k + 1))
            return Draft(torch.tensor([t if i < good else (t + 1 + i) % 64 for i, t in enumerate(true[: self.k])]))

    out = generate_batch(model, prompts, proposer=Scripted(3), max_new_tokens=budgets, compact_fraction=0.2)
    for i, (r, want) in enumerate(zip(out, plain)):
        assert r.tokens.tolist() == want, f"row {i} differs from plain greedy decoding of its prompt alone"
    assert out[0].stats.accepted > 0 and out[1].stats.accepted == 0
