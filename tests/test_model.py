"""The GPT: KV cache against a full forward, sampled log-probs, padding, checkpoints."""
import torch
from torch.nn import functional as F
from model import GPT, GPTConfig, pad_left, response_logits, save_checkpoint, load_checkpoint

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


def test_padded_batch_scores_like_alone():
    m = model()
    a, b = [5, 6, 7, 8, 9, 10], [11, 12]
    idx, mask = pad_left([a, b], 0)
    resp = torch.randint(0, 61, (2, 6))
    batch = response_logits(m, idx, mask, resp, 1.0)
    for i, p in enumerate([a, b]):
        alone = response_logits(m, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.bool), resp[i:i + 1], 1.0)
        torch.testing.assert_close(batch[i:i + 1], alone, atol=1e-5, rtol=1e-5)


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
