"""Data parallelism on the CPU (gloo, 2 processes) against one process on the union of the ranks' data: a
pretraining step (AdamW; --optimizer=muon's Muon + AdamW, to bf16's rounding) and a PPO iteration (make_experience +
ppo_update) end with the same parameters, whitening uses the statistics of the union; train_ppo feeds both ranks'
β controllers the KL over both and each rank draws its own share of ptx windows (resumed exactly); `torchrun
--nproc_per_node=2 train.py` writes what `python train.py` writes.
Also the gpu preset: its config passes the checks and its model runs forward and backward in bf16 (a reduced batch,
on the CPU)."""
import copy, os, socket, subprocess, sys
import pytest
import torch
import torch.multiprocessing as mp

import data, ppo, train
from machinery import dist, optim, records, store
from pipeline import stages
from machinery.config import override
from pipeline.pretrain import PretrainConfig
from conftest import recording_controller
from machinery.errors import RunError
from kl import KLConfig
from model import GPT, GPTConfig
from machinery.optim import adamw, StepGuard
from machinery.precision import autocast
from sequences import pad_left
from ref import Reference
from reward import ScalarModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EOS, N = 0, 2


# ---- the data both sides use: the same on every rank (fixed seeds); rank r takes rows r*B/N .. (r+1)*B/N ----
def lm_batch():
    g = torch.Generator().manual_seed(1)
    xy = torch.randint(1, 50, (8, 17), generator=g)
    return xy[:, :-1], xy[:, 1:]                                          # (8, 16), (8, 16)


def models():
    """Actor, reference (differs from the actor), critic and reward model with random heads."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=24, vocab_size=50, n_layer=2, n_head=2, n_embd=32)
    ref_model = GPT(cfg).eval()
    actor = copy.deepcopy(ref_model)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    critic, rm = ScalarModel(copy.deepcopy(ref_model)), ScalarModel(copy.deepcopy(ref_model))
    for m in (critic, rm):
        torch.nn.init.normal_(m.head.weight, 0, 0.5)
    return actor, Reference(ref_model), critic, rm.requires_grad_(False)


def rollout():
    """4 left-padded prompts and responses of 6 tokens with 6 (truncated), 2 | 3, 5 real tokens: each rank's two
    rows hold 8 tokens. Per-rank token means, averaged over ranks, are the union's token mean only then (the
    convention of DDP: every rank's loss weighs the same)."""
    q, qm = pad_left([[1, 2, 4, 5], [5, 6], [7, 8, 9], [10]], EOS)
    resp = torch.tensor([[3, 4, 5, 6, 7, 8], [9, EOS, EOS, EOS, EOS, EOS], [11, 12, EOS, EOS, EOS, EOS],
                         [13, 14, 15, 16, EOS, EOS]])
    return q, qm, resp


def whiten_data():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 5, generator=g) * 3 + 1
    mask = torch.arange(5)[None] < torch.tensor([5, 1, 2, 4, 3, 5])[:, None]    # unequal tokens per rank
    return x, mask


PPO_CFG = ppo.PPOConfig(rollout_batch=4, minibatch_size=4, ppo_epochs=2, ppo_lr=1e-3, vf_lr=1e-3, cliprange=0.1,
                        ent_coef=0.01, max_grad_norm=0.05, gamma=0.9, lam=0.8)
KL_CFG = KLConfig(kl_in="loss", kl_estimator="k3")


def pretrain_step(x, y, optimizer="adamw"):
    """Two steps of the pretraining loop's step (forward, StepGuard: sync, clip, AdamW; or --optimizer=muon's Muon
    and AdamW, from optim.pretrain_optimizer) on this process's rows."""
    torch.manual_seed(3)
    model = GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32))
    opt, guard = adamw(model.parameters(), 1e-2, weight_decay=0.1), StepGuard("test")
    if optimizer == "muon":
        opt = optim.pretrain_optimizer(model, PretrainConfig(optimizer="muon", lr=1e-2, muon_lr=0.05))
    for _ in range(2):
        guard.backward_and_step(model(x, y)[1], opt, list(model.parameters()), 0.3)      # a clip that binds
    return model.state_dict()


def ppo_iteration(rows, minibatch_size):
    """One PPO iteration through the pipeline's functions (make_experience, ppo_update) on the given rows."""
    actor, ref, critic, rm = models()
    q, qm, resp = (t[rows] for t in rollout())
    batch, _ = ppo.make_experience(actor, critic, ref, ref, rm, q, qm, resp, EOS, 0.2, KL_CFG, PPO_CFG, 0.8)
    opts = optim.make_optimizers(actor, critic, PPO_CFG)
    cfg = ppo.PPOConfig(**{**PPO_CFG.__dict__, "minibatch_size": minibatch_size})
    ppo.ppo_update(actor, critic, opts, (StepGuard("actor"), StepGuard("critic")), batch, cfg, 0.8, 0.2, KL_CFG)
    return dict(actor=actor.state_dict(), critic=critic.state_dict(), advantages=batch["advantages"])


class Letters:
    """A stand-in tokenizer for train_ppo: letters a.. as ids 1.., end-of-text 0."""
    eot_token = 0

    def encode_ordinary(self, text):
        return [1 + (ord(c) - 97) % 40 for c in text]

    def decode(self, ids):
        return "".join(chr(96 + i) for i in ids)


def ppo_loop(out, monkeypatch_fed, *flags):
    """train_ppo itself, 3 iterations on the tiny models; returns (what the β controller was fed, metrics rows)."""
    _, ref, critic, rm = models()
    actor = copy.deepcopy(ref.model).requires_grad_(True)                 # PPO starts at the reference
    cfg = train.parse(override(["--preset=smoke", "--ppo_iters=3", "--rollout_batch=8", "--minibatch_size=4",
                                "--response_length=8", "--ppo_lr=1e-2", "--kl_horizon=10", "--device=cpu"], list(flags)))
    fed = []
    monkeypatch_fed(recording_controller(ppo.make_kl_controller, fed))
    metrics, _ = ppo.train_ppo(actor, critic.requires_grad_(True), ref, rm, Letters(), ["abc", "de", "fghij", "k"],
                               cfg, out, dict(test=1), log=lambda s: None)
    return fed, metrics


def ptx_draws(out, iters):
    """The pretraining windows (inputs) this rank drew in train_ppo with --ptx_coef, run_dir `out` (resumed when
    it holds a state); train.bin is in out's parent."""
    drawn, windows = [], data.windows
    ppo.data.windows = lambda *a: drawn.append(windows(*a)) or drawn[-1]
    try:
        ppo_loop(out, lambda f: None, "--ptx_coef=0.5", f"--out_dir={os.path.dirname(out)}", "--block_size=24",
                 f"--ppo_iters={iters}", "--save_interval=1")
    finally:
        ppo.data.windows = windows
    return [x for x, _ in drawn]


def _worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(N))
    torch.set_num_threads(1)
    dist.init("cpu")                                                       # the path train.main takes
    share = lambda b: slice(rank * b // N, (rank + 1) * b // N)
    x, y = lm_batch()
    res = dict(pretrain=pretrain_step(x[share(8)], y[share(8)]), muon=pretrain_step(x[share(8)], y[share(8)], "muon"))
    xw, mw = whiten_data()
    res["whiten"] = ppo.whiten(xw[share(6)], mw[share(6)])
    res["ppo"] = ppo_iteration(share(4), PPO_CFG.minibatch_size // N)
    make = ppo.make_kl_controller
    res["fed"], res["metrics"] = ppo_loop(out, lambda f: setattr(ppo, "make_kl_controller", f))
    ppo.make_kl_controller = make                                          # the runs below feed no list
    res["ptx"] = ptx_draws(os.path.join(out, "ptx"), 3)
    first = ptx_draws(os.path.join(out, "cut"), 2)
    dist.barrier()                      # rank 0 has written ppo_state.pt: both ranks resume it (a new launch would)
    res["ptx_resumed"] = first + ptx_draws(os.path.join(out, "cut"), 3)
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    dist.close()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each of 2 gloo processes computed on its share."""
    out = str(tmp_path_factory.mktemp("ranks"))
    for d in ("ptx", "cut"):
        os.makedirs(os.path.join(out, d))
    g = torch.Generator().manual_seed(4)                                   # ptx: a train.bin of 3000 tokens < 50
    torch.randint(1, 50, (3000,), generator=g).numpy().astype("uint16").tofile(os.path.join(out, "train.bin"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, out), nprocs=N)
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=True) for r in range(N)]


def assert_same(a, b, atol):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


def test_a_pretraining_step_on_2_ranks_equals_one_process_on_the_union(ranks):
    union = pretrain_step(*lm_batch())
    assert_same(ranks[0]["pretrain"], ranks[1]["pretrain"], 0)             # the replicas stay identical
    assert_same(ranks[0]["pretrain"], union, 2e-6)
    torch.manual_seed(3)
    before = GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).state_dict()
    assert max((union[k] - before[k]).abs().max() for k in before) > 1e-2       # two steps did move the weights


def test_a_muon_pretraining_step_on_2_ranks_equals_one_process_on_the_union(ranks):
    """StepGuard averages every gradient before the step, so both ranks orthogonalise the same momentum: the replicas
    stay identical. Against one process on the union: torch's Muon orthogonalises in bf16 (8 bits of mantissa) and
    its Newton-Schulz steps amplify a rounding flip, so fp32's different sums move each tensor by up to ~3.5 % of
    its two-step change (measured); 5 % is the bound. A rank stepping on its own half alone is 60-120 % off."""
    union = pretrain_step(*lm_batch(), "muon")
    assert_same(ranks[0]["muon"], ranks[1]["muon"], 0)
    torch.manual_seed(3)
    before = GPT(GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32)).state_dict()
    off = {k: float((ranks[0]["muon"][k] - union[k]).norm() / (union[k] - before[k]).norm()) for k in union}
    assert max(off.values()) < 0.05, off
    assert max((union[k] - ranks[0]["pretrain"][k]).abs().max() for k in union) > 1e-2    # not AdamW's step


def test_whitening_across_ranks_equals_whitening_of_the_union(ranks):
    x, mask = whiten_data()
    torch.testing.assert_close(torch.cat([r["whiten"] for r in ranks]), ppo.whiten(x, mask), atol=1e-6, rtol=0)


def test_a_ppo_iteration_on_2_ranks_equals_one_process_on_the_union(ranks):
    union = ppo_iteration(slice(0, 4), PPO_CFG.minibatch_size)
    torch.testing.assert_close(torch.cat([r["ppo"]["advantages"] for r in ranks]),
                               union["advantages"], atol=1e-5, rtol=0)
    for model in ("actor", "critic"):
        assert_same(ranks[0]["ppo"][model], ranks[1]["ppo"][model], 0)
        assert_same(ranks[0]["ppo"][model], union[model], 2e-5)


# ---- the whole pipeline under torchrun ----
SHORT = ["--max_iters=40", "--n_pairs=200", "--rm_epochs=1", "--ppo_iters=2", "--n_eval=8", "--n_samples=8"]


def test_torchrun_runs_every_stage_and_writes_what_one_process_writes(run, tmp_path):
    out = str(tmp_path / "ddp")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={N}",
                        "train.py", "--preset=smoke", f"--out_dir={out}", *SHORT], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    known = {n for st in stages.STAGES for n in st.outputs + [st.partial] if n} | \
        {"config.json", "stages.json", "timings.json", ".lock"}
    assert set(os.listdir(out)) <= known                                   # nothing else (no rank 1 files)
    assert set(os.listdir(out)) == known & set(os.listdir(run))            # what the single-process smoke run made
    assert p.stdout.count("---- stage world ----") == 1                   # rank 0 alone prints
    recs = store.load_json(os.path.join(out, "stages.json"))
    assert all(records.outputs_intact(out, recs[st.name]) for st in stages.STAGES if not st.optional)
    rows = store.load_json(os.path.join(out, "metrics.jsonl"), lines=True)
    assert len(rows) == 2 and rows[0]["objective/kl_exact"] == 0 and rows[1]["objective/kl_exact"] > 0
    assert all(r["policy/ratio_dev_first"] < 1e-5 for r in rows)           # old log-probs: each rank's own policy
    cfg = train.parse(["--preset=smoke"])                                  # β moved for all 16 rollouts, not 8
    e = min(max(rows[0]["objective/kl_penalized"] / cfg.kl.kl_target - 1, -0.2), 0.2)
    assert rows[1]["objective/kl_coef"] == pytest.approx(cfg.kl.init_kl_coef * (1 + e * 16 / cfg.kl.kl_horizon))
    assert rows[0]["val/num_eos_tokens"] + 16 * rows[0]["objective/missing_eos"] == pytest.approx(16)   # all 16
    assert store.load_json(os.path.join(out, "ppo.json"))["reference_unchanged"] is True


def test_a_batch_that_the_processes_cannot_share_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit) as e:
        train.parse(["--preset=smoke"])
    assert e.value.code == 2 and "is not divisible by the 3 processes" in capsys.readouterr().err


def test_torchrun_with_a_bad_flag_prints_one_line_from_rank_0(tmp_path):
    """Both ranks refuse the flag; rank 0 alone says so, and it is the root cause torchrun reports (exit code 2).
    What follows the line is torchrun's own (its log lines, traceback and failure summary)."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={N}",
                        "train.py", "--preset=smoke", f"--out_dir={out}", "--seed=-1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode != 0 and len(lines) == 1 and "--seed" in lines[0], p.stderr
    root = p.stderr.split("Root Cause")[1]
    assert "rank      : 0" in root and "exitcode  : 2" in root and not out.exists()


def test_a_rank_other_than_0_waits_silent_then_speaks_if_rank_0_does_not_stop(monkeypatch, capsys):
    from machinery import errors
    waits = []
    monkeypatch.setattr(errors.time, "sleep", waits.append)             # rank 0 never stopped it
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as e:
        errors.die("only this rank", 2)
    assert waits == [errors.RANK0_GRACE] and e.value.code == 2
    assert capsys.readouterr().err == "error: only this rank\n"


def test_a_checkpoint_saved_by_another_number_of_processes_is_refused():
    with pytest.raises(RunError, match="ppo_state.pt was saved by 2 process"):
        dist.mine([{}, {}], "ppo_state.pt")                             # 1 process here, 2 random states saved
    assert dist.mine({"torch": 1}, "x") == {"torch": 1}


# ---- the gpu preset, at a reduced batch on the CPU (no GPU was available to this project) ----
def test_the_gpu_preset_passes_the_checks_on_1_to_8_processes(monkeypatch):
    for n in (1, 2, 4, 8):
        monkeypatch.setenv("WORLD_SIZE", str(n))
        cfg = train.parse(["--preset=gpu", "--device=cpu"])
    assert (cfg.run.dtype, cfg.gpt.n_layer, cfg.gpt.n_embd, cfg.gpt.block_size, cfg.pretrain.compile) == \
        ("bf16", 8, 512, 256, True)


def test_the_gpu_preset_model_runs_forward_and_backward_in_bf16():
    import dataclasses
    cfg = train.parse(["--preset=gpu", "--device=cpu"])
    g = dataclasses.replace(cfg.gpt, vocab_size=cfg.world.vocab_size)
    torch.manual_seed(0)
    model = GPT(g)
    assert 20e6 < model.num_params() < 35e6
    assert model.wpe.weight.shape == (256, 512) and len(model.blocks) == 8
    x = torch.randint(g.vocab_size, (1, 32))                               # batch 1 x 32 tokens (the preset: 64 x 256)
    with autocast("cpu", cfg.run.dtype):
        logits, loss = model(x, x)
        q, qm = pad_left([[1, 2, 3], [4]], EOS)
        lp = ppo.response_logits(model, q, qm, x.expand(2, 32), 1.0)       # the PPO path, left-padded
    assert logits.shape == (1, 32, 1024) and logits.dtype == torch.bfloat16     # the matmuls ran in bf16
    assert loss.dtype == lp.dtype == torch.float32 and lp.shape == (2, 32, 1024)   # log-probs in fp32
    with autocast("cpu", cfg.run.dtype):
        assert ScalarModel(model)(x).dtype == torch.float32                # rewards and values in fp32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_ppo_loop_feeds_every_rank_s_controller_the_kl_over_all_ranks(ranks):
    """train_ppo on 2 ranks: each controller is fed the same number, the logged mean over both ranks' rollouts,
    so β is the same everywhere; the logged rows are the same on both ranks (reduced before logging)."""
    assert ranks[0]["fed"] == ranks[1]["fed"]
    assert ranks[0]["fed"] == pytest.approx([r["objective/kl_penalized"] for r in ranks[0]["metrics"]], rel=1e-6)
    assert ranks[0]["fed"][-1] > 0                                         # the policy moved: a KL to agree on
    no_time = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    assert no_time(ranks[0]["metrics"]) == no_time(ranks[1]["metrics"])


def test_each_rank_draws_its_own_share_of_ptx_windows_and_resumes_it_exactly(ranks):
    """--ptx_coef under torchrun: each rank draws minibatch_size / 2 windows per minibatch from its own stream (not
    the same windows on every rank: that is one rank's data computed twice), and a run stopped after iteration 2
    and resumed draws, on each rank, the windows the uninterrupted run drew (the streams are saved per rank)."""
    a, b = ranks[0]["ptx"], ranks[1]["ptx"]
    assert len(a) == len(b) == 3 * 2 * 2                                   # iterations x epochs x minibatches
    assert all(x.shape == (PPO_CFG.minibatch_size // N, 24) for x in a + b)
    assert all(not torch.equal(x, y) for x, y in zip(a, b))
    assert len({tuple(x.reshape(-1).tolist()) for x in a + b}) == len(a + b)    # no window set drawn twice
    for r in ranks:
        assert len(r["ptx_resumed"]) == len(r["ptx"]) and all(map(torch.equal, r["ptx_resumed"], r["ptx"]))
