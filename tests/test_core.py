"""The core files on a run folder made in a second, without training (the fast loop's own fixture): the smoke
world, an untrained 1-layer GPT as pretrain.pt and ref.pt, a reward model made from it, a perturbed copy as
actor.pt, and config.json at temperature 0.7.

    python -m pytest -q -m core        # this file and every core test that needs no pipeline run

sample.py's load_run samples, refuses what its command refuses, and scores through the pipeline's functions:
its exact KL to the reference against a loop over every position and every token of the vocabulary (0 for the
reference's own weights); dpo.py's sequence log-probs against each row scored alone with its end-of-text;
reward.py's score against the scalar model's last real token, one row at a time."""
import dataclasses, os
import pytest
import torch
from torch.nn import functional as F

import data, dpo, reward, sample, tokenizer, train
from model import GPT, GPTConfig
from ref import load_reference, save_checkpoint
from machinery import store
from machinery.errors import RunError

T = 0.7
PROMPT = "review: the nova pro phone\n"


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("micro"))
    data.build_world(out, seed=3, n_reviews=300, vocab_size=300)
    enc = tokenizer.load_tokenizer(out, "bpe")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=32, block_size=96))
    save_checkpoint(model, os.path.join(out, "pretrain.pt"))
    save_checkpoint(model, os.path.join(out, "ref.pt"))
    reward.save_scalar_model(reward.from_pretrained(model), os.path.join(out, "reward.pt"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    save_checkpoint(model, os.path.join(out, "actor.pt"))
    cfg = train.parse(["--preset=smoke", f"--out_dir={out}", f"--temperature={T}"])
    store.save_json(os.path.join(out, "config.json"), {g: dataclasses.asdict(c) for g, c in vars(cfg).items()})
    return out


def kl_by_hand(actor, ref, enc, prompt, response):
    """Σ over response positions of Σ_v p(v)·(log p(v) − log q(v)) at temperature T, each position from one full
    forward of the row alone."""
    seq = [enc.eot_token] + enc.encode_ordinary(prompt) + response
    n = len(seq) - len(response)
    with torch.no_grad():
        lp = F.log_softmax(actor(torch.tensor([seq]))[0][0] / T, -1)      # (L, V)
        lq = F.log_softmax(ref(torch.tensor([seq]))[0][0] / T, -1)        # (L, V)
    total = 0.0
    for t in range(n - 1, len(seq) - 1):
        total += (lp[t].exp() * (lp[t] - lq[t])).sum().item()
    return total


def test_load_run_samples_and_refuses_what_the_command_refuses(micro):
    run = sample.load_run(micro)
    texts = run.sample(PROMPT, num_samples=3, seed=1)
    assert len(texts) == 3 and texts == run.sample(PROMPT, num_samples=3, seed=1)
    for bad in (dict(temperature=-1.0), dict(num_samples=0), dict(top_k=-1), dict(temperature=float("nan"))):
        with pytest.raises(RunError):
            run.sample(PROMPT, **bad)


def test_the_exact_kl_to_the_reference_is_a_loop_over_every_token(micro):
    enc = tokenizer.load_tokenizer(micro, "bpe")
    ids = sample.load_run(micro).sample(PROMPT, num_samples=2, seed=2, tokens=True)
    actor = sample.load_run(micro).model
    ref = load_reference(os.path.join(micro, "ref.pt"), "cpu").model
    for response in ids:
        per_token, total = sample.load_run(micro).kl_to_ref(PROMPT, response)
        assert total == pytest.approx(kl_by_hand(actor, ref, enc, PROMPT, list(response)), rel=1e-4, abs=1e-5)
        assert total > 0 and len(per_token) == len(response)
        assert sample.load_run(micro, "pretrain").kl_to_ref(PROMPT, response)[1] == pytest.approx(0, abs=1e-6)


def test_dpo_s_sequence_log_probs_are_each_row_alone_with_its_end_of_text(micro):
    enc = tokenizer.load_tokenizer(micro, "bpe")
    actor = sample.load_run(micro).model
    prompt = [enc.eot_token] + enc.encode_ordinary(PROMPT)
    chosen = prompt + enc.encode_ordinary("great screen.") + [enc.eot_token]
    rejected = prompt + enc.encode_ordinary("the battery is bad and it")
    pair = dict(prompt=PROMPT, chosen=chosen, rejected=rejected)
    q, qm, resp, mask = dpo.pair_tensors(enc, [pair])
    got = dpo.pair_logprobs(dpo.sequence_logprobs(actor, q, qm, resp, mask, T))[0]      # (2,)
    for i, seq in enumerate((chosen, rejected)):
        with torch.no_grad():
            logp = F.log_softmax(actor(torch.tensor([seq]))[0][0] / T, -1)              # (L, V)
        want = sum(logp[t - 1, seq[t]].item() for t in range(len(prompt), len(seq)))
        assert got[i].item() == pytest.approx(want, abs=1e-4)


def test_the_reward_is_the_scalar_model_at_the_last_real_token(micro):
    enc = tokenizer.load_tokenizer(micro, "bpe")
    rm, _ = reward.load_scalar_model(os.path.join(micro, "reward.pt"))
    prompt = [enc.eot_token] + enc.encode_ordinary(PROMPT)
    seqs = [prompt + enc.encode_ordinary("great.") + [enc.eot_token], prompt + enc.encode_ordinary("so so so")]
    scores = reward.score(rm, seqs, enc.eot_token)
    for seq, s in zip(seqs, scores):
        alone = reward.score(rm, [seq], enc.eot_token)[0]
        assert float(s.detach()) == pytest.approx(float(alone.detach()), abs=1e-5)
