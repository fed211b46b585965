r"""Sample from a finished run: its RLHF actor (or its pretrained model, its frozen reference, or
the DPO actor of --stage=dpo), from the command line or from Python; and, from Python, score any
response as the pipeline scores it.

    python sample.py                     # the RLHF actor of out/ on 8 held-out prompts
    python sample.py --prompt='review: the nova pro phone\n' --num_samples=4 --top_k=40
    python sample.py --ckpt=pretrain --prompt_file=prompts.txt --temperature=0.7
    python sample.py --start=FILE:prompt.txt --device=auto   # nanoGPT's --start
    python sample.py --ckpt=dpo          # after python train.py --stage=dpo
    python sample.py --help              # every flag

From Python, with this folder on the path (run from it, or PYTHONPATH=path/to/tether):

    from sample import load_run
    run = load_run("out")                # the actor and the run's own tokenizer
    texts = run.sample("review: the nova pro phone\n", num_samples=3, top_k=40)
    ids = run.sample("review: the nova pro phone\n", tokens=True)[0]
    run.logprobs(prompt, ids)            # (R,) log-probs at the run's temperature
    run.kl_to_ref(prompt, ids)           # (R,) exact KL to ref.pt, and its sum
    run.reward(prompt, ids), run.gold(prompt, ids)   # the proxy's score, the human's

A prompt is text. The end-of-text token goes before it, as before every document after the first
in the pretraining stream and every prompt PPO saw (sequences.encode_prompts). `Run.sample` returns
each response up to its end-of-text, without it (end_of_text=True: with it where the response
ended; tokens=True: its token ids, with it). The scores take a response as those ids, or as text:
up to and including its first end-of-text (data.EOT), scored as that token; what follows it is not
the response's, as for sequences.response_mask and the simulated human; text without one is a
response cut off at its length. Text is scored as its BPE encoding (encode_ordinary), which is not
always the ids the model sampled (about 1 response in 6 of the smoke run's actor: the same text,
other tokens), so the pipeline's own numbers for a sample come from its ids. The scores are the
report's: `logprobs` and `kl_to_ref` at config.json's --temperature (model.response_logits,
kl.kl_full against ref.pt's Reference), `reward` the reward model's normalised score
(reward.score), `gold` data.gold_score; all in fp32, as a run of the default --dtype=fp32 computes
them (a --dtype=bf16 run's report differs by bf16's rounding). ref.pt and reward.pt are read when
first needed, so sampling needs neither.
The command prints each response with the simulated human's gold score and, where the run has its
reward.pt, the proxy's; it writes nothing. A prompt file holds one prompt per line, each given its
newline back (the world's prompts end with one); --start is nanoGPT's: a prompt, or FILE:path for
a file's whole text as one prompt. Bad input, from the command line or Python, is one line
(RunError; the command: exit 2).
Left out: beam search, streaming tokens as they are sampled, chat templates, scoring in bf16.
"""
# Ctrl-C while the imports below load torch (seconds) is one line and exit 130.
if __name__ == "__main__":
    from machinery.errors import ctrl_c_while_starting
    ctrl_c_while_starting()
from dataclasses import dataclass, field, fields
import json, math, numbers, os, sys, warnings
import torch

import data, tokenizer
from kl import kl_full
from model import GPT, response_logits, token_logprobs
from ref import load_reference
from reward import load_scalar_model, score as reward_score
from sequences import encode_prompts, join_tokens, response_mask
from machinery.config import RULES, RunConfig, arg, parse_args
from machinery.errors import RunError, die, run_main
from machinery.records import load_records
from ref import load_checkpoint

# --ckpt -> the file it loads.
CHECKPOINTS = {"actor": "actor.pt", "pretrain": "pretrain.pt", "dpo": "dpo_actor.pt",
               "ref": "ref.pt"}
# The most bytes a prompt file may hold (10 MB, far more than any prompts); at most one more is
# read, so an endless file (/dev/zero, a pipe) is refused, not read into memory.
MAX_PROMPT_BYTES = 10_000_000


@dataclass
class SampleConfig:
    out_dir: str = arg("out", help="a finished run's folder (python train.py made it)")
    ckpt: str = arg("actor", help="actor (the PPO actor, actor.pt), pretrain (pretrain.pt), ref "
                    "(the frozen reference, ref.pt) or dpo (dpo_actor.pt, after --stage=dpo)",
                    choices=list(CHECKPOINTS))
    prompt: str = arg("", help=r"your prompt, e.g. 'review: the nova pro phone\n' (default: 8 "
                      "held-out prompts)")
    prompt_file: str = arg("", help="a file of prompts, one per line (UTF-8, at most 10 MB)")
    start: str = arg("", help=r"nanoGPT's --start: a prompt, as --prompt, or FILE:path for a "
                     "file's whole text as one prompt")
    num_samples: int = arg(1, "[1,100000]", "responses per prompt")
    temperature: float = arg(1.0, ">=0.01", "sampling temperature (the runs use 1.0)")
    top_k: int = arg(0, ">=0", "sample among the k likeliest tokens only (0: all)")
    max_new_tokens: int = arg(0, ">=0", "most response tokens (0: the run's --response_length)")
    seed: int = arg(1337, "[0,2^31)", "the sampling noise")
    device: str = arg("cpu", help="auto (cuda when available), cpu, cuda or mps",
                      choices=["auto", "cpu", "cuda", "mps"])


def broken_rule(config, name, value):
    """How `value` breaks the rule of `config`'s field `name`, as its --name=value flag would be
    refused, in a few words ("must be a finite float, >=0.01"); None when it keeps it: of the
    field's type (an int for an int, a finite number for a float) and within its rule
    (machinery.config.RULES)."""
    f = next(f for f in fields(config) if f.name == name)
    kind = {"int": int, "float": float}.get(f.type, f.type)
    # bool is an int to Python, never to a flag.
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is int:
        ok = ok and isinstance(value, numbers.Integral)
    if ok and math.isfinite(value) and RULES[f.metadata["rule"]](value):
        return None
    return f"must be a finite {kind.__name__}, {f.metadata['rule']}"


def command(out_dir, name):
    """The command that makes the file `name` in out_dir (sample.py makes nothing)."""
    stage = " --stage=dpo" if name == CHECKPOINTS["dpo"] else ""
    return f"python train.py --out_dir={out_dir}{stage}"


def remake(out_dir, name):
    """The command that makes `name` in out_dir again: train.py redoes what it finds damaged."""
    return f"{command(out_dir, name)} (with the flags that made the run)"


def need(out_dir, name):
    """One line, and the command that makes it, when out_dir has no file `name`."""
    if not os.path.isfile(os.path.join(out_dir, name)):
        raise RunError(f"{out_dir} has no {name}: run {command(out_dir, name)} first")


def load_file(out_dir, name, load, what):
    """load(path) of out_dir's file `name`; one line naming the file, and the command that makes
    it again, when it is missing, unreadable or not `what`."""
    need(out_dir, name)
    path = os.path.join(out_dir, name)
    try:
        with warnings.catch_warnings(record=True) as caught:
            loaded = load(path)
    except RunError as e:
        # store.load_torch's line: torch could not read it (the cause is the error it handled).
        cause = type(e.__context__ or e).__name__
        raise RunError(f"cannot load {path} ({cause}): {remake(out_dir, name)} makes it again")
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as e:
        # A torch file of another shape: another model's weights, a bare tensor, a list.
        raise RunError(f"{path} is not {what} ({type(e).__name__}): {remake(out_dir, name)} "
                       "makes it again")
    # What torch warned of while a load worked is shown; while one failed, the line above says it
    # all (a bare tensor, indexed as a checkpoint, warns before it fails).
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return loaded


def recorded(out_dir):
    """(response_length, temperature) of the run, as its config.json records them (RunConfig's
    defaults when it has none); one line when the file is not a run's config.json."""
    path = os.path.join(out_dir, "config.json")
    if not os.path.exists(path):
        return RunConfig.response_length, RunConfig.temperature
    fix = f"{remake(out_dir, 'config.json')} writes it again"
    try:
        with open(path) as f:
            made = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise RunError(f"cannot read {path} ({type(e).__name__}): {fix}")
    run = made.get("run") if isinstance(made, dict) else None
    if not isinstance(run, dict):
        raise RunError(f"{path} is not a run's config.json (no run group): {fix}")
    values = []
    for name in ("response_length", "temperature"):
        value = run.get(name, getattr(RunConfig, name))
        why = broken_rule(RunConfig, name, value)
        if why:
            raise RunError(f"{path}: run.{name} is {value!r} ({why}): {fix}")
        values.append(value)
    return values[0], float(values[1])


def resolve_device(device):
    """auto, cpu, cuda or mps -> the device to load onto (auto: cuda when torch sees it, else the
    CPU); one line when torch does not see it."""
    if device not in SampleConfig.__dataclass_fields__["device"].metadata["choices"]:
        raise RunError(f"device={device!r}: choose auto, cpu, cuda or mps")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RunError("--device=cuda but torch sees no CUDA device here (use cpu or auto)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise RunError("--device=mps but torch sees no MPS device here (use cpu or auto)")
    return device


@dataclass
class Run:
    """A finished run's model and tokenizer, ready to sample and to score. temperature: the
    run's, for the scores; out_dir: where ref.pt and reward.pt are read from, when first needed
    (None: a Run made by hand, whose kl_to_ref and reward have nothing to read)."""
    model: GPT
    enc: object
    response_length: int
    temperature: float = RunConfig.temperature
    out_dir: str = None
    # ref.pt's Reference and reward.pt's model, once loaded.
    loaded: dict = field(default_factory=dict, repr=False)

    @torch.no_grad()
    def sample(self, prompt, num_samples=1, temperature=1.0, top_k=None, max_new_tokens=None,
               seed=None, end_of_text=False, tokens=False):
        """num_samples responses (text, up to end-of-text, without it; end_of_text=True: with it,
        where a response ended, as the simulated human reads it; tokens=True: each a list of token
        ids, with it, as the pipeline scores it) to `prompt` (text, without the leading
        end-of-text: it is added here). top_k and max_new_tokens: None or 0 for all tokens and
        the run's length. seed: torch's generator is seeded with it first (None: as it stands).
        RunError for what sample.py's flags refuse, and when prompt and response cannot fit
        block_size."""
        given = dict(num_samples=num_samples, temperature=temperature, top_k=top_k,
                     max_new_tokens=max_new_tokens, seed=seed)
        for name, value in given.items():
            why = None if value is None else broken_rule(SampleConfig, name, value)
            if why:
                raise RunError(f"bad value for {name}: {value!r} ({why}, as sample.py's --{name})")
        n_new = max_new_tokens or self.response_length
        q, qm = encode_prompts(self.enc, [self.checked_prompt(prompt)] * num_samples)  # (n, Tp)
        self.check_fits(q.size(1), n_new, "new tokens", "lower --max_new_tokens")
        if seed is not None:
            torch.manual_seed(seed)
        device = self.model.lm_head.weight.device
        self.model.eval()
        resp, _ = self.model.generate(q.to(device), n_new, temperature, top_k=top_k or None,
                                      eos=self.enc.eot_token, mask=qm.to(device))  # (n, R)
        # Up to end-of-text, with it or without it.
        mask = response_mask(resp, self.enc.eot_token)
        if tokens:
            return [r[m].tolist() for r, m in zip(resp.cpu(), mask.cpu())]
        if not end_of_text:
            mask = mask & (resp != self.enc.eot_token)
        return [self.enc.decode(r[m].tolist()) for r, m in zip(resp.cpu(), mask.cpu())]

    @torch.no_grad()
    def logprobs(self, prompt, response):
        """(R,) the log-prob of each response token under this model at the run's temperature,
        the end-of-text last where the response has one."""
        q, qm, resp, _ = self.encoded(prompt, response)
        logits = response_logits(self.model, q, qm, resp, self.temperature)  # (1, R, V)
        return token_logprobs(logits, resp)[0].cpu()  # (R,)

    @torch.no_grad()
    def kl_to_ref(self, prompt, response):
        """(per token (R,), summed over the response) the exact KL(this model ‖ the run's ref.pt)
        at the run's temperature: the report's "exact KL to reference" of one response."""
        q, qm, resp, m = self.encoded(prompt, response)
        if "ref" not in self.loaded:
            self.loaded["ref"] = self.run_file("ref.pt", load_reference, "a GPT checkpoint")
        logits = response_logits(self.model, q, qm, resp, self.temperature)  # (1, R, V)
        ref_logits = self.loaded["ref"].logits(q, qm, resp, self.temperature)  # (1, R, V)
        kl = kl_full(logits, ref_logits)  # (1, R)
        return kl[0].cpu(), (kl * m).sum(1).item()

    @torch.no_grad()
    def reward(self, prompt, response):
        """The reward model's score of prompt + response: normalised as every stage reads it (the
        pretrained model's samples: mean 0, std 1), the report's proxy score."""
        q, qm, resp, m = self.encoded(prompt, response)
        if "reward" not in self.loaded:
            rm, _ = self.run_file("reward.pt", load_scalar_model, "a reward model checkpoint")
            self.loaded["reward"] = rm.requires_grad_(False)
        return reward_score(self.loaded["reward"], join_tokens(q, qm, resp, m),
                            self.enc.eot_token).item()

    def gold(self, prompt, response):
        """The simulated human's gold score (data.gold_score) of the response, text or ids."""
        if not isinstance(response, str):
            response = self.enc.decode(self.response_ids(response))
        return data.gold_score(self.checked_prompt(prompt), response)

    def run_file(self, name, load, what):
        """load(path, device) of the run's file `name`: ref.pt, reward.pt."""
        if self.out_dir is None:
            raise RunError(f"this Run has no run folder to read {name} from: make it with "
                           "load_run(out_dir)")
        device = self.model.lm_head.weight.device
        return load_file(self.out_dir, name, lambda path: load(path, device), what)

    def checked_prompt(self, prompt):
        if not isinstance(prompt, str):
            raise RunError(f"the prompt is text, not {type(prompt).__name__}")
        return prompt

    def check_fits(self, n_prompt, n_response, what, fix):
        limit = self.model.config.block_size
        if n_prompt + n_response > limit:
            raise RunError(f"the prompt ({n_prompt} tokens with its end-of-text) and "
                           f"{n_response} {what} exceed the model's block_size {limit}: shorten "
                           f"the prompt or {fix}")

    def response_ids(self, response):
        """A response's token ids: its BPE encoding for text (see the file's docstring), as given
        for a list of ids; up to and including the first end-of-text either way."""
        eot = self.enc.eot_token
        if isinstance(response, str):
            body, end, _ = response.partition(data.EOT)
            ids = self.enc.encode_ordinary(body) + [eot] * bool(end)
        elif isinstance(response, (list, tuple, torch.Tensor)):
            ids = response.tolist() if isinstance(response, torch.Tensor) else list(response)
            vocab = self.model.config.vocab_size
            for t in ids:
                if not isinstance(t, numbers.Integral) or isinstance(t, bool) or \
                        not 0 <= t < vocab:
                    raise RunError(f"the response holds {t!r}, not a token id in [0, {vocab})")
            ids = [int(t) for t in ids]
            if eot in ids:
                ids = ids[:ids.index(eot) + 1]
        else:
            raise RunError("a response is text or a list of token ids, not "
                           f"{type(response).__name__}")
        if not ids:
            raise RunError("the response is empty: no token to score (a response that ended at "
                           "once is the end-of-text alone, data.EOT)")
        return ids

    def encoded(self, prompt, response):
        """Prompt (1, Tp) and its mask, response (1, R) and its mask, on the model's device."""
        ids = self.response_ids(response)
        q, qm = encode_prompts(self.enc, [self.checked_prompt(prompt)])  # (1, Tp)
        self.check_fits(q.size(1), len(ids), "response tokens", "the response")
        resp = torch.tensor([ids])  # (1, R)
        m = response_mask(resp, self.enc.eot_token)  # (1, R)
        device = self.model.lm_head.weight.device
        return q.to(device), qm.to(device), resp.to(device), m.to(device)


def load_run(out_dir="out", ckpt="actor", device="cpu"):
    """The Run of a finished out_dir: the checkpoint `ckpt` names (actor, pretrain, dpo or ref)
    on `device` (auto, cpu, cuda or mps), the tokenizer its world was made with, its response
    length and temperature (config.json). RunError (one line) when the folder has no such run or
    a file of it is damaged."""
    if ckpt not in CHECKPOINTS:
        raise RunError(f"ckpt={ckpt!r}: choose {', '.join(CHECKPOINTS)}")
    device = resolve_device(device)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RunError(f"{out_dir} is a file, not a folder: give a finished run's folder")
    name = CHECKPOINTS[ckpt]
    # The world's tokenizer, as its record says (ours when there is no record and a tokenizer.bpe).
    made = load_records(out_dir).get("world", {}).get("config", {})
    bpe = os.path.exists(os.path.join(out_dir, "tokenizer.bpe"))
    need(out_dir, name)
    enc = tokenizer.load_tokenizer(out_dir, made.get("tokenizer", "bpe" if bpe else "gpt2"))
    model, _ = load_file(out_dir, name, lambda path: load_checkpoint(path, device),
                         "a GPT checkpoint")
    length, temperature = recorded(out_dir)
    return Run(model.eval(), enc, length, temperature, out_dir)


def read_prompt_file(path, flag):
    """The text of a prompt file, read no further than MAX_PROMPT_BYTES + 1 bytes; one line, that
    names it as `flag` gave it, when it cannot be read, is larger, or is not UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PROMPT_BYTES + 1)
    except OSError as e:
        raise RunError(f"{flag}: cannot read it ({e.strerror or e})")
    if len(raw) > MAX_PROMPT_BYTES:
        raise RunError(f"{flag}: over {MAX_PROMPT_BYTES / 1e6:g} MB, more than any prompts (is "
                       "it the right file?)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunError(f"{flag}: not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})")


def prompts_of(cfg):
    """The prompts to sample: --prompt, --start (FILE:path: the file's text), the lines of
    --prompt_file, or 8 held-out prompts."""
    if cfg.prompt:
        return [cfg.prompt]
    if cfg.start.startswith("FILE:"):
        text = read_prompt_file(cfg.start[len("FILE:"):], f"--start={cfg.start}")
        if not text.strip():
            raise RunError(f"--start={cfg.start} holds no prompt")
        return [text]
    if cfg.start:
        # A shell passes \n as two characters (as for --prompt).
        return [cfg.start.replace("\\n", "\n")]
    if cfg.prompt_file:
        text = read_prompt_file(cfg.prompt_file, f"--prompt_file={cfg.prompt_file}")
        # Universal newlines, as a file opened as text reads them.
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        lines = [line for line in lines if line.strip()]
        if not lines:
            raise RunError(f"--prompt_file={cfg.prompt_file} holds no prompt")
        return [line + "\n" for line in lines]
    path = os.path.join(cfg.out_dir, "prompts.json")
    try:
        heldout = data.load_prompts(cfg.out_dir)["heldout"][:8]
    except (RunError, KeyError, TypeError):
        heldout = None
    if not isinstance(heldout, list) or not all(isinstance(p, str) for p in heldout):
        raise RunError(f"cannot read the held-out prompts of {path}: "
                       f"{remake(cfg.out_dir, 'prompts.json')} makes it again")
    return heldout


def main(argv):
    cfg = parse_args(argv, {"sample": SampleConfig}, __doc__).sample
    given = [f"--{n}" for n in ("prompt", "prompt_file", "start") if getattr(cfg, n)]
    if len(given) > 1:
        die(f"{' and '.join(given)} each give prompts: choose one")
    try:
        run = load_run(cfg.out_dir, cfg.ckpt, cfg.device)
        # The proxy's score where the run has its reward model (sampling needs only the model).
        proxy = os.path.isfile(os.path.join(cfg.out_dir, "reward.pt"))
        torch.manual_seed(cfg.seed)
        for p in prompts_of(cfg):
            for ids in run.sample(p, cfg.num_samples, cfg.temperature, cfg.top_k,
                                  cfg.max_new_tokens, tokens=True):
                text = run.enc.decode(ids).replace(data.EOT, "")
                score = f", proxy {run.reward(p, ids):+.2f}" if proxy else ""
                print(f"[gold {run.gold(p, ids):+.2f}{score}] {p.strip()} | {text}", flush=True)
    except RunError as e:
        die(str(e), e.code)
    except KeyboardInterrupt:
        die("interrupted; nothing was written", 130)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
