"""sample.py, as a user runs it: a script outside the project loads a finished smoke run through the documented
API (PYTHONPATH, `from sample import load_run`) and samples from it; the prompt gets its leading end-of-text and the
responses end before theirs; top-k and the temperature reach the sampler; same seed, same text; bad input is one
line and exit 2, before any work."""
import os, subprocess, sys, textwrap
import pytest
import torch

import sample
from model import GPT
from sequences import encode_prompts

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
