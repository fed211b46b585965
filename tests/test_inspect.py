"""python train.py --stage=inspect: the page is written, is well-formed self-contained HTML, and every number on it
is what kl.py gives for the same tokens (recomputed here from the models through the real functions)."""
import os
from html.parser import HTMLParser
import torch
import data, train
from kl import kl_full
from model import encode_prompts, load_checkpoint, response_logits, token_logprobs

VOID = {"meta", "br"}


class Page(HTMLParser):
    """Checks that every tag closes in order; collects each response block's tokens from its `exact` line."""

    def __init__(self):
        super().__init__()
        self.stack, self.blocks = [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "div" and a.get("class") == "resp":
            self.blocks.append(dict(model=a["data-model"], prompt=a["data-prompt"], lines=[]))
        if tag == "p" and a.get("class") == "line":
            self.blocks[-1]["lines"].append([])
        if tag == "span" and "data-tok" in a:
            self.blocks[-1]["lines"][-1].append((int(a["data-tok"]), float(a["data-k1"]), float(a["data-kl"])))

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"</{tag}> closes nothing open"


def test_inspect_page_is_valid_and_its_numbers_are_kl_py_s(run):
    train.main(["--preset=smoke", f"--out_dir={run}", "--stage=inspect", "--inspect_n=2"])
    text = open(os.path.join(run, "inspect.html"), encoding="utf-8").read()
    for external in ("<script", "http://", "https://", "@font-face", "src=", "@import"):
        assert external not in text                                       # one self-contained file
    page = Page()
    page.feed(text)
    page.close()
    assert page.stack == [] and len(page.blocks) == 4                     # 2 prompts x (pretrained, RLHF)
    enc = data.load_tokenizer(run, "bpe")
    ref, _ = load_checkpoint(os.path.join(run, "ref.pt"))
    cfg = train.parse(["--preset=smoke"])
    moved = 0
    for b in page.blocks:
        exact_line, k1_line = b["lines"]
        assert exact_line == k1_line and exact_line                       # both lines show the same tokens
        model, _ = load_checkpoint(b["model"])
        q, qm = encode_prompts(enc, [b["prompt"]])
        resp = torch.tensor([[t for t, _, _ in exact_line]])              # (1, R)
        with torch.no_grad():
            logits = response_logits(model, q, qm, resp, cfg.run.temperature)       # (1, R, V)
            ref_logits = response_logits(ref, q, qm, resp, cfg.run.temperature)
            kl = kl_full(logits, ref_logits)[0]
            k1 = (token_logprobs(logits, resp) - token_logprobs(ref_logits, resp))[0]
        torch.testing.assert_close(torch.tensor([v for _, _, v in exact_line]), kl, atol=2e-6, rtol=0)
        torch.testing.assert_close(torch.tensor([v for _, v, _ in exact_line]), k1, atol=2e-6, rtol=0)
        if b["model"].endswith("pretrain.pt"):
            assert kl.abs().max() == 0                                    # the reference is the pretrained model
        else:
            moved += kl.sum().item() > 0
    assert moved == 2                                                     # the RLHF actor is not the reference
