"""Sample from a finished run: its RLHF actor (or its pretrained model, or the DPO actor of
--stage=dpo), from the command line or from Python.

    python sample.py                     # the RLHF actor of out/ on 8 held-out prompts
    python sample.py --prompt='review: the nova pro phone\n' --num_samples=4 --top_k=40
    python sample.py --ckpt=pretrain --prompt_file=prompts.txt --temperature=0.7
    python sample.py --ckpt=dpo          # after python train.py --stage=dpo
    python sample.py --help              # every flag

From Python, with this folder on the path (run from it, or PYTHONPATH=path/to/tether):

    from sample import load_run
    run = load_run("out")                # the actor and the run's own tokenizer
    print(run.sample("review: the nova pro phone\n", num_samples=3, top_k=40))

A prompt is text. `Run.sample` puts the end-of-text token before it, as before every document
after the first in the pretraining stream and every prompt PPO saw (sequences.encode_prompts),
and returns each response up to its end-of-text, without it. A prompt file holds one prompt per
line; each gets its newline back (the world's prompts end with one). The command prints each
response with the simulated human's gold score; it writes nothing.
Left out: beam search, streaming tokens as they are sampled, chat templates.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
from dataclasses import dataclass
import os, sys
import torch

import data, tokenizer
from model import GPT
from sequences import encode_prompts, response_mask
from machinery import store
from machinery.config import arg, parse_args
from machinery.errors import RunError, die, run_main
from machinery.records import load_records
from machinery.state import load_checkpoint

# --ckpt -> the file it loads.
CHECKPOINTS = {"actor": "actor.pt", "pretrain": "pretrain.pt", "dpo": "dpo_actor.pt"}


@dataclass
class SampleConfig:
    out_dir: str = arg("out", help="a finished run's folder (python train.py made it)")
    ckpt: str = arg("actor", help="actor (the PPO actor, actor.pt), pretrain (pretrain.pt) or "
                    "dpo (dpo_actor.pt, after --stage=dpo)",
                    choices=list(CHECKPOINTS))
    prompt: str = arg("", help=r"your prompt, e.g. 'review: the nova pro phone\n' (default: 8 "
                      "held-out prompts)")
    prompt_file: str = arg("", help="a file of prompts, one per line")
    num_samples: int = arg(1, "[1,100000]", "responses per prompt")
    temperature: float = arg(1.0, ">=0.01", "sampling temperature (the runs use 1.0)")
    top_k: int = arg(0, ">=0", "sample among the k likeliest tokens only (0: all)")
    max_new_tokens: int = arg(0, ">=0", "most response tokens (0: the run's --response_length)")
    seed: int = arg(1337, "[0,2^31)", "the sampling noise")
    device: str = arg("cpu", help="cpu, cuda or mps", choices=["cpu", "cuda", "mps"])


@dataclass
class Run:
    """A finished run's model and tokenizer, ready to sample."""
    model: GPT
    enc: object
    response_length: int

    @torch.no_grad()
    def sample(self, prompt, num_samples=1, temperature=1.0, top_k=None, max_new_tokens=None,
               seed=None, end_of_text=False):
        """num_samples responses (text, up to end-of-text, without it; end_of_text=True: with it,
        where a response ended, as the simulated human reads it) to `prompt` (text, without the
        leading end-of-text: it is added here). seed: torch's generator is seeded with it first
        (None: as it stands). RunError when prompt and response cannot fit block_size."""
        n_new = max_new_tokens or self.response_length
        q, qm = encode_prompts(self.enc, [prompt] * num_samples)  # (n, Tp)
        limit = self.model.config.block_size
        if q.size(1) + n_new > limit:
            raise RunError(f"the prompt ({q.size(1)} tokens with its end-of-text) and "
                           f"{n_new} new tokens exceed the model's block_size {limit}: shorten "
                           "the prompt or lower --max_new_tokens")
        if seed is not None:
            torch.manual_seed(seed)
        device = self.model.lm_head.weight.device
        self.model.eval()
        resp, _ = self.model.generate(q.to(device), n_new, temperature, top_k=top_k or None,
                                      eos=self.enc.eot_token, mask=qm.to(device))  # (n, R)
        # Up to end-of-text, with it or without it.
        mask = response_mask(resp, self.enc.eot_token)
        if not end_of_text:
            mask = mask & (resp != self.enc.eot_token)
        return [self.enc.decode(r[m].tolist()) for r, m in zip(resp.cpu(), mask.cpu())]


def load_run(out_dir="out", ckpt="actor", device="cpu"):
    """The Run of a finished out_dir: the checkpoint `ckpt` names (actor, pretrain or dpo) on
    `device`, the tokenizer its world was made with, its response length. RunError (one line)
    when the folder has no such run."""
    if ckpt not in CHECKPOINTS:
        raise RunError(f"ckpt={ckpt!r}: choose {', '.join(CHECKPOINTS)}")
    path = os.path.join(out_dir, CHECKPOINTS[ckpt])
    if not os.path.isfile(path):
        raise RunError(f"{out_dir} has no {CHECKPOINTS[ckpt]}: run python train.py "
                       f"--out_dir={out_dir} first")
    # The world's tokenizer, as its record says (ours when there is no record and a tokenizer.bpe).
    made = load_records(out_dir).get("world", {}).get("config", {})
    bpe = os.path.exists(os.path.join(out_dir, "tokenizer.bpe"))
    enc = tokenizer.load_tokenizer(out_dir, made.get("tokenizer", "bpe" if bpe else "gpt2"))
    model, _ = load_checkpoint(path, device)
    # The run's response length, as its config.json says.
    length = 64
    if os.path.exists(os.path.join(out_dir, "config.json")):
        length = store.load_json(os.path.join(out_dir, "config.json"))["run"]["response_length"]
    return Run(model.eval(), enc, length)


def prompts_of(cfg):
    """The prompts to sample: --prompt, the lines of --prompt_file, or 8 held-out prompts."""
    if cfg.prompt:
        return [cfg.prompt]
    if cfg.prompt_file:
        try:
            with open(cfg.prompt_file) as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise RunError(f"--prompt_file={cfg.prompt_file}: cannot read it ({e.strerror})")
        if not lines:
            raise RunError(f"--prompt_file={cfg.prompt_file} holds no prompt")
        return [line + "\n" for line in lines]
    return data.load_prompts(cfg.out_dir)["heldout"][:8]


def main(argv):
    cfg = parse_args(argv, {"sample": SampleConfig}, __doc__).sample
    if cfg.prompt and cfg.prompt_file:
        die("--prompt and --prompt_file both give prompts: choose one")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        die("--device=cuda but torch sees no CUDA device here")
    if cfg.device == "mps" and not torch.backends.mps.is_available():
        die("--device=mps but torch sees no MPS device here")
    try:
        run = load_run(cfg.out_dir, cfg.ckpt, cfg.device)
        torch.manual_seed(cfg.seed)
        for p in prompts_of(cfg):
            for r in run.sample(p, cfg.num_samples, cfg.temperature, cfg.top_k,
                                cfg.max_new_tokens, end_of_text=True):
                text = r.replace(data.EOT, "")
                print(f"[gold {data.gold_score(p, r):+.2f}] {p.strip()} | {text}", flush=True)
    except RunError as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted; nothing was written", 130)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
