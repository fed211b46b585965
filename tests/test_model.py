"""The GPT: KV cache against a full forward, sampled log-probs, padding, checkpoints."""
import torch
from torch.nn import functional as F
import pytest
from model import GPT, GPTConfig, response_logits, token_logprobs
from sequences import pad_left, response_mask
from ref import load_checkpoint, save_checkpoint

CFG = GPTConfig(block_size=48, vocab_size=61, n_layer=2, n_head=4, n_embd=32)


def model():
    torch.manual_seed(0)
    return GPT(CFG).eval()


def test_kv_cache_logits_equal_full_forward():
    m = model()
    x = torch.randint(0, 61, (3, 20))
    full, _ = m(x)
    cache = [None] * CFG.n_layer
    steps = [m(x[:, :7], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_generate_logprobs_match_full_forward():
    m, T = model(), 0.7
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    idx, mask = pad_left(prompts, 0)
    torch.manual_seed(1)
    toks, logps = m.generate(idx, 15, temperature=T, eos=3, mask=mask)
    for i, p in enumerate(prompts):                   # each row scored alone, no padding, no cache
        seq = torch.tensor([p + toks[i].tolist()])
        ref = F.log_softmax(m(seq)[0][0, len(p) - 1:-1] / T, -1).gather(1, toks[i][:, None])[:, 0]
        stop = (toks[i] == 3).nonzero()
        n = stop[0, 0].item() + 1 if len(stop) else toks.size(1)
        torch.testing.assert_close(logps[i, :n], ref[:n], atol=1e-5, rtol=1e-5)
        assert (toks[i, n:] == 3).all() and (logps[i, n:] == 0).all()   # padded after end-of-text


def test_response_logits_in_a_padded_batch_equal_each_row_alone():
    """Position j of the response is predicted by the logits after prompt + response[:j], divided by T."""
    m, T = model(), 0.6
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    idx, mask = pad_left(prompts, 0)
    resp = torch.randint(0, 61, (3, 6))
    batch = response_logits(m, idx, mask, resp, T)                                  # (B, R, V)
    for i, p in enumerate(prompts):
        full = m(torch.tensor([p + resp[i].tolist()]))[0][0]                        # (Tp + R, V), no padding
        for j in range(6):
            torch.testing.assert_close(batch[i, j], full[len(p) - 1 + j] / T, atol=1e-5, rtol=1e-5)


def test_sampled_logprobs_equal_the_scored_ones():
    """What generate (KV cache) says it sampled with is what the scoring forward (PPO's old log-probs) says, at a
    temperature other than 1 and with prompts of different lengths."""
    m, T = model(), 0.7
    idx, mask = pad_left([[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]], 0)
    torch.manual_seed(4)
    toks, logps = m.generate(idx, 12, temperature=T, eos=3, mask=mask)
    scored = token_logprobs(response_logits(m, idx, mask, toks, T), toks)
    real = response_mask(toks, 3)
    torch.testing.assert_close(scored[real], logps[real], atol=1e-5, rtol=1e-5)


def test_response_mask_ends_at_the_first_end_of_text():
    toks = torch.tensor([[4, 3, 3, 3], [4, 5, 6, 7], [3, 3, 3, 3], [4, 5, 3, 3]])
    for row, m in zip(toks.tolist(), response_mask(toks, 3).tolist()):
        n = row.index(3) + 1 if 3 in row else len(row)
        assert m == [True] * n + [False] * (len(row) - n)


def test_top_k_samples_only_the_top_k():
    m = model()
    torch.manual_seed(2)
    toks, logps = m.generate(torch.tensor([[1, 2]]).repeat(64, 1), 1, top_k=3)
    top3 = m(torch.tensor([[1, 2]]))[0][0, -1].topk(3).indices
    assert set(toks[:, 0].tolist()) <= set(top3.tolist())
    assert (logps > torch.log(torch.tensor(0.3))).any()                 # renormalised over the top 3


def test_checkpoint_roundtrip(tmp_path):
    m = model()
    save_checkpoint(m, tmp_path / "m.pt")
    m2, _ = load_checkpoint(tmp_path / "m.pt")                        # torch.load(weights_only=True) inside
    x = torch.randint(0, 61, (2, 10))
    assert m2.config == CFG and torch.equal(m(x)[0], m2.eval()(x)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_checkpoint_loads_onto_cuda(tmp_path):
    save_checkpoint(model(), tmp_path / "m.pt")
    m2, _ = load_checkpoint(tmp_path / "m.pt", "cuda")
    assert all(p.is_cuda for p in m2.parameters())
