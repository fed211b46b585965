"""sample.py, as a user runs it: a script outside the project loads a finished smoke run through the documented
API (PYTHONPATH, `from sample import load_run`) and samples from it; the prompt gets its leading end-of-text and the
responses end before theirs; top-k and the temperature reach the sampler; same seed, same text; bad input (flags,
prompt files, damaged or foreign files, and what the Python API is given) is one line and exit 2, before any work;
Run.logprobs, kl_to_ref, reward and gold give the report's own numbers for the report's own samples; --start,
--device=auto, --help and the proxy's score on the command line."""
import dataclasses, math, os, shutil, subprocess, sys, textwrap
from types import SimpleNamespace
import pytest
import torch

import data, sample, tokenizer
from model import GPT, response_logits, token_logprobs
from sequences import encode_prompts, response_mask
from machinery import store
from options.evaluate import evaluate_policy
from pipeline.stages import load_models, seed_everything
from ref import load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "review: the nova pro phone\n"


def test_a_script_outside_the_project_samples_through_the_documented_api(run, tmp_path):
    script = tmp_path / "mine.py"
    script.write_text(textwrap.dedent(f"""
        from sample import load_run
        run = load_run({run!r})
        for text in run.sample({PROMPT!r}, num_samples=3, top_k=20, temperature=0.8, seed=5):
            print(repr(text))
    """))
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    texts = [eval(line) for line in p.stdout.splitlines()]
    here = sample.load_run(run).sample(PROMPT, num_samples=3, top_k=20, temperature=0.8, seed=5)
    assert texts == here and len(texts) == 3 and all("<|endoftext|>" not in t for t in texts)


def test_the_prompt_gets_its_end_of_text_and_the_sampler_its_settings(run, monkeypatch):
    loaded = sample.load_run(run)
    seen = {}
    generate = GPT.generate

    def spy(self, idx, max_new_tokens, temperature=1.0, top_k=None, eos=None, mask=None):
        seen.update(idx=idx, n=max_new_tokens, temperature=temperature, top_k=top_k, eos=eos)
        return generate(self, idx, max_new_tokens, temperature, top_k, eos, mask)
    monkeypatch.setattr(GPT, "generate", spy)
    texts = loaded.sample(PROMPT, num_samples=2, temperature=0.7, top_k=3, max_new_tokens=12, seed=0)
    q, _ = encode_prompts(loaded.enc, [PROMPT])
    assert seen["idx"][0].tolist() == q[0].tolist() and q[0, 0] == loaded.enc.eot_token
    assert (seen["n"], seen["temperature"], seen["top_k"], seen["eos"]) == (12, 0.7, 3, loaded.enc.eot_token)
    ended = loaded.sample(PROMPT, num_samples=2, temperature=0.7, top_k=3, max_new_tokens=12, seed=0,
                          end_of_text=True)
    assert [t.replace("<|endoftext|>", "") for t in ended] == texts
    # No top-k: every token may come.
    loaded.sample(PROMPT, top_k=0, seed=0)
    assert seen["top_k"] is None


def test_the_pretrained_model_is_there_too_and_one_seed_gives_one_text(run):
    a = sample.load_run(run, "pretrain").sample(PROMPT, num_samples=4, seed=3)
    b = sample.load_run(run, "pretrain").sample(PROMPT, num_samples=4, seed=3)
    c = sample.load_run(run, "actor").sample(PROMPT, num_samples=4, seed=3)
    assert a == b and a != c


@pytest.mark.parametrize("argv, why", [
    (["--ckpt=critic"], "choose actor, pretrain"),
    (["--num_samples=0"], "[1,100000]"),
    (["--temperature=0"], ">=0.01"),
    (["--top_k=-1"], ">=0"),
    (["--prompt=x", "--prompt_file=y"], "choose one"),
    (["--prompt_file=/nonexistent/p.txt"], "cannot read it"),
    (["--num_samples", "3"], "write --num_samples=3"),
    (["--device=cuda"], "no CUDA device") if not torch.cuda.is_available() else (["--top_k=-2"], ">=0"),
])
def test_bad_input_is_one_line_and_exit_2(run, capsys, argv, why):
    with pytest.raises(SystemExit) as e:
        sample.main([f"--out_dir={run}", *argv])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and why in err and out == "", err


def test_a_prompt_file_gives_each_line_with_its_newline(run, tmp_path, capsys):
    f = tmp_path / "prompts.txt"
    f.write_text("review: the nova pro phone\n\nreview: the apex mini car\n")
    sample.main([f"--out_dir={run}", f"--prompt_file={f}", "--num_samples=2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and sum("] review: the apex mini car | " in line for line in lines) == 2


# ---- hostile input: one line, exit 2, never a traceback ----
def copy_run(run, dest, names=("actor.pt", "pretrain.pt", "ref.pt", "reward.pt", "tokenizer.bpe", "prompts.json",
                               "config.json", "stages.json")):
    """The files sample.py reads, copied from the finished run into dest."""
    os.makedirs(dest, exist_ok=True)
    for n in names:
        shutil.copy(os.path.join(run, n), os.path.join(dest, n))
    return str(dest)


def refused(argv, capsys):
    """sample.main(argv)'s one line on stderr, after checking it exits 2 and prints nothing else."""
    with pytest.raises(SystemExit) as e:
        sample.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and out == "", err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def test_a_prompt_file_that_is_not_utf8_is_one_line(run, tmp_path, capsys):
    f = tmp_path / "latin1.txt"
    f.write_bytes("review: the café phone\n".encode("latin-1") + b"\xff\xfe\n")
    assert "not UTF-8" in refused([f"--out_dir={run}", f"--prompt_file={f}"], capsys)


def test_an_endless_prompt_file_is_read_no_further_than_the_cap(run, tmp_path, capsys, monkeypatch):
    # /dev/zero never ends: at most the cap and one byte are read.
    if os.path.exists("/dev/zero"):
        err = refused([f"--out_dir={run}", "--prompt_file=/dev/zero"], capsys)
        assert "over 10 MB" in err and "/dev/zero" in err
    # A regular file over the cap (made small here) is refused too, and one at the cap is read.
    monkeypatch.setattr(sample, "MAX_PROMPT_BYTES", 60)
    f = tmp_path / "prompts.txt"
    f.write_text(PROMPT * 3)
    assert "--prompt_file" in refused([f"--out_dir={run}", f"--prompt_file={f}"], capsys)
    f.write_text(PROMPT * 2)
    sample.main([f"--out_dir={run}", f"--prompt_file={f}"])
    assert len(capsys.readouterr().out.splitlines()) == 2


def damage_with_a_tensor(path):
    torch.save(torch.zeros(3), path)


def damage_with_garbage(path):
    with open(path, "wb") as f:
        f.write(b"not a checkpoint at all")


@pytest.mark.parametrize("damage", ["reward.pt", "a tensor", "garbage"])
def test_a_file_that_is_not_a_gpt_checkpoint_is_one_line_naming_it(run, tmp_path, capsys, damage):
    out = copy_run(run, tmp_path / "run")
    actor = os.path.join(out, "actor.pt")
    if damage == "reward.pt":
        shutil.copy(os.path.join(out, "reward.pt"), actor)
    elif damage == "a tensor":
        damage_with_a_tensor(actor)
    else:
        damage_with_garbage(actor)
    err = refused([f"--out_dir={out}"], capsys)
    # sample.py makes nothing: the line says which command makes the file again.
    assert actor in err and f"python train.py --out_dir={out}" in err and "the same command" not in err, err
    with pytest.raises(sample.RunError, match="actor.pt"):
        sample.load_run(out)
    # As a user runs it: one line on stderr, no warning of torch's before it.
    p = subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), f"--out_dir={out}"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: ") and not p.stdout


WRONG_SHAPES = [("config.json", c) for c in ["{}", "[]", "null", '{"run": 3}', '{"run": {"response_length": "x"}}',
                                              '{"run": {"response_length": 0}}', '{"run": {"temperature": -1}}',
                                              '{"run": ']] + \
               [("prompts.json", c) for c in ["{}", "[]", '{"heldout": "review: x"}', '{"heldout": [3]}', "{"]]


@pytest.mark.parametrize("name,content", WRONG_SHAPES)
def test_a_config_or_prompts_json_of_the_wrong_shape_is_one_line(run, tmp_path, capsys, name, content):
    out = copy_run(run, tmp_path / "run")
    with open(os.path.join(out, name), "w") as f:
        f.write(content)
    err = refused([f"--out_dir={out}"], capsys)
    assert name in err and f"python train.py --out_dir={out}" in err and "the same command" not in err


# Every value the command line's rules refuse, given to the Python API.
API_REFUSES = [dict(num_samples=0), dict(num_samples=100001), dict(num_samples=2.5), dict(temperature=-1.0),
               dict(temperature=0), dict(temperature=float("nan")), dict(temperature=float("inf")),
               dict(top_k=-1), dict(max_new_tokens=-5), dict(seed=-1), dict(seed=2 ** 31),
               dict(temperature="1"), dict(num_samples=True)]


@pytest.mark.parametrize("kw", API_REFUSES, ids=[repr(kw) for kw in API_REFUSES])
def test_the_api_refuses_what_the_command_line_refuses(run, kw, capsys):
    (name, value), = kw.items()
    rule = next(f for f in dataclasses.fields(sample.SampleConfig) if f.name == name).metadata["rule"]
    with pytest.raises(sample.RunError) as e:
        sample.load_run(run).sample(PROMPT, **kw)
    assert name in str(e.value) and rule in str(e.value) and len(str(e.value).splitlines()) == 1
    # The command line refuses the same value, where it can be written as a flag.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert f"--{name}" in refused([f"--out_dir={run}", f"--{name}={value}"], capsys)


def test_the_api_takes_what_the_command_line_takes(run):
    loaded = sample.load_run(run)
    assert len(loaded.sample(PROMPT, num_samples=2, temperature=0.01, top_k=0, max_new_tokens=0, seed=0)) == 2
    assert len(loaded.sample(PROMPT, temperature=2, top_k=None, max_new_tokens=None, seed=2 ** 31 - 1)) == 1


def test_the_advice_names_the_command_that_makes_the_file(run, tmp_path, capsys):
    out = copy_run(run, tmp_path / "run")
    # dpo_actor.pt is made by --stage=dpo alone.
    assert f"python train.py --out_dir={out} --stage=dpo" in refused([f"--out_dir={out}", "--ckpt=dpo"], capsys)
    # A file, not a folder.
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = refused([f"--out_dir={afile}"], capsys)
    assert "not a folder" in err and "has no" not in err
    with pytest.raises(sample.RunError, match="not a folder"):
        sample.load_run(str(afile))


# ---- the learner's API: the pipeline's own numbers for any prompt and response ----
def pipeline_samples(run, monkeypatch):
    """The report's RLHF-actor samples, as the report stage made them (its seed, evaluate_policy), with the token
    ids the pipeline scored: (metrics, [(prompt, text, gold, proxy, ids)])."""
    cfg = store.load_json(os.path.join(run, "config.json"))
    settings = SimpleNamespace(**{**cfg["run"], "device": "cpu"})
    enc = tokenizer.load_tokenizer(run, cfg["world"]["tokenizer"])
    _, ref, rm = load_models(run, "cpu")
    actor, _ = load_checkpoint(os.path.join(run, "actor.pt"))
    made = []
    generate = GPT.generate

    def spy(self, *a, **kw):
        out = generate(self, *a, **kw)
        made.append(out[0])
        return out
    monkeypatch.setattr(GPT, "generate", spy)
    seed_everything(settings.seed + 1)
    metrics, examples = evaluate_policy(actor, enc, data.load_prompts(run)["heldout"], settings, ref, rm,
                                        cfg["eval"]["n_eval"])
    monkeypatch.setattr(GPT, "generate", generate)
    resp = torch.cat(made)
    ids = [r[m].tolist() for r, m in zip(resp, response_mask(resp, enc.eot_token))]
    return metrics, [(*e, i) for e, i in zip(examples, ids)]


def test_kl_reward_gold_and_logprobs_are_the_report_s(run, monkeypatch):
    metrics, samples = pipeline_samples(run, monkeypatch)
    report = store.load_json(os.path.join(run, "report.json"))["rlhf"]
    # The report, reproduced.
    assert metrics["kl"] == pytest.approx(report["kl"], rel=1e-4)
    assert metrics["proxy_mean"] == pytest.approx(report["proxy_mean"], rel=1e-4, abs=1e-6)
    actor, ref = sample.load_run(run), sample.load_run(run, "ref")
    kls, proxies, golds, nll, ntok = [], [], [], 0.0, 0
    for p, text, gold, proxy, ids in samples:
        per_token, total = actor.kl_to_ref(p, ids)
        assert per_token.shape == (len(ids),) and total == pytest.approx(per_token.sum().item(), rel=1e-5, abs=1e-7)
        kls.append(total)
        proxies.append(actor.reward(p, ids))
        assert proxies[-1] == pytest.approx(proxy, rel=1e-4, abs=1e-5)
        golds.append(actor.gold(p, ids))
        assert golds[-1] == gold == actor.gold(p, text)
        lp = ref.logprobs(p, ids)
        nll, ntok = nll - lp.sum().item(), ntok + len(lp)
        # A text response is its own BPE encoding: where the sampled ids are that encoding, the same numbers.
        body, eot, _ = text.partition(data.EOT)
        if actor.enc.encode_ordinary(body) + [actor.enc.eot_token] * bool(eot) == ids:
            assert actor.kl_to_ref(p, text)[1] == total and actor.reward(p, text) == proxies[-1]
    assert sum(kls) / len(kls) == pytest.approx(report["kl"], rel=1e-4)
    assert sum(proxies) / len(proxies) == pytest.approx(report["proxy_mean"], rel=1e-4, abs=1e-5)
    assert sum(golds) / len(golds) == pytest.approx(report["gold_mean"], rel=1e-9)
    assert math.exp(nll / ntok) == pytest.approx(report["ref_ppl"], rel=1e-4)
    assert ntok / len(samples) == report["response_length"]
    # The reference is at KL 0 from itself.
    assert ref.kl_to_ref(*samples[0][0::4])[1] == 0.0


def test_ref_is_ref_pt_and_sample_can_return_the_token_ids(run):
    ref = sample.load_run(run, "ref")
    want, _ = load_checkpoint(os.path.join(run, "ref.pt"))
    assert all(torch.equal(a, b) for a, b in zip(ref.model.state_dict().values(), want.state_dict().values()))
    ids = ref.sample(PROMPT, num_samples=3, seed=4, tokens=True)
    texts = ref.sample(PROMPT, num_samples=3, seed=4, end_of_text=True)
    assert [ref.enc.decode(i) for i in ids] == texts and all(isinstance(t, int) for i in ids for t in i)


def test_logprobs_are_at_the_run_s_temperature_and_a_response_ends_at_its_end_of_text(run, tmp_path):
    out = copy_run(run, tmp_path / "run")
    cfg = store.load_json(os.path.join(out, "config.json"))
    cfg["run"]["temperature"] = 0.5
    store.save_json(os.path.join(out, "config.json"), cfg)
    hot, cold = sample.load_run(run), sample.load_run(out)
    assert cold.temperature == 0.5 and hot.temperature == 1.0
    text = " great screen." + data.EOT
    q, qm = encode_prompts(cold.enc, [PROMPT])
    ids = cold.enc.encode_ordinary(" great screen.") + [cold.enc.eot_token]
    resp = torch.tensor([ids])
    want = token_logprobs(response_logits(cold.model, q, qm, resp, 0.5), resp)[0]
    assert torch.allclose(cold.logprobs(PROMPT, text), want) and not torch.allclose(hot.logprobs(PROMPT, text), want)
    # What follows the end-of-text is not the response's; without one, the response was cut off (no end-of-text
    # token to score).
    assert torch.equal(cold.logprobs(PROMPT, text + " more"), cold.logprobs(PROMPT, text))
    assert torch.equal(cold.logprobs(PROMPT, " great screen."), cold.logprobs(PROMPT, text)[:-1])
    assert cold.gold(PROMPT, text + " more") == data.gold_score(PROMPT, text)


@pytest.mark.parametrize("prompt, response, why", [
    (PROMPT, "", "empty"), (PROMPT, [], "empty"), (PROMPT, 7, "text or a list of token ids"),
    (PROMPT, [10 ** 6], "token id"), (3, " good.", "prompt"), (PROMPT, " very" * 200, "block_size")])
def test_the_scores_refuse_what_cannot_be_scored(run, prompt, response, why):
    loaded = sample.load_run(run)
    for method in (loaded.logprobs, loaded.kl_to_ref, loaded.reward):
        with pytest.raises(sample.RunError, match=why):
            method(prompt, response)


def test_a_run_without_its_reference_or_reward_model_says_which_file_is_missing(run, tmp_path):
    out = copy_run(run, tmp_path / "run", ["actor.pt", "tokenizer.bpe", "prompts.json"])
    loaded = sample.load_run(out)
    assert len(loaded.logprobs(PROMPT, " good." + data.EOT)) > 1
    with pytest.raises(sample.RunError, match="has no ref.pt"):
        loaded.kl_to_ref(PROMPT, " good.")
    with pytest.raises(sample.RunError, match="has no reward.pt"):
        loaded.reward(PROMPT, " good.")


# ---- the command line ----
def test_start_is_nanogpt_s_prompt_and_file_is_one_prompt(run, tmp_path, capsys):
    sample.main([f"--out_dir={run}", r"--prompt=review: the nova pro phone\n", "--num_samples=2"])
    by_prompt = capsys.readouterr().out
    sample.main([f"--out_dir={run}", r"--start=review: the nova pro phone\n", "--num_samples=2"])
    assert capsys.readouterr().out == by_prompt
    f = tmp_path / "start.txt"
    f.write_text(PROMPT)
    sample.main([f"--out_dir={run}", f"--start=FILE:{f}", "--num_samples=2"])
    assert capsys.readouterr().out == by_prompt
    assert "choose one" in refused([f"--out_dir={run}", "--start=x", "--prompt=y"], capsys)
    assert "choose one" in refused([f"--out_dir={run}", "--start=x", f"--prompt_file={f}"], capsys)
    assert "cannot read it" in refused([f"--out_dir={run}", "--start=FILE:/nonexistent/p.txt"], capsys)


def test_device_auto_and_the_help_s_example_prompt(run, capsys):
    sample.main([f"--out_dir={run}", "--device=auto", "--num_samples=1"])
    assert len(capsys.readouterr().out.splitlines()) == 8
    with pytest.raises(SystemExit) as e:
        sample.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and r"--prompt='review: the nova pro phone\n' --num_samples=4" in out
    assert "--start=" in out and "auto" in out


def test_each_response_is_printed_with_its_gold_and_proxy_score(run, capsys):
    sample.main([f"--out_dir={run}", r"--prompt=review: the nova pro phone\n", "--num_samples=3", "--seed=9"])
    lines = capsys.readouterr().out.splitlines()
    loaded = sample.load_run(run)
    torch.manual_seed(9)
    ids = loaded.sample(PROMPT, num_samples=3, tokens=True)
    for line, i in zip(lines, ids):
        assert line.startswith(f"[gold {loaded.gold(PROMPT, i):+.2f}, proxy {loaded.reward(PROMPT, i):+.2f}] "), line
    assert len(lines) == 3
