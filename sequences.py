"""Sequence conventions every stage shares: left padding, prompts as token ids, response masks,
masked means, and prompt + response joined back into one list of ids.

    python -m pytest -q tests/test_model.py   # padding and masks, through the GPT that reads them

Prompts are left-padded (B, Tp) with a mask that is True at real tokens, so every prompt ends at
the same column and sampling appends to all of them at once. A response (B, R) is real up to and
including its first end-of-text; what follows is padding (`response_mask`).
Left out: right padding, packed sequences, attention masks beyond padding.
"""
import torch


def pad_left(seqs, pad_id):
    """List of token-id lists -> idx (B, T) left-padded with pad_id, mask (B, T) True at real
    tokens."""
    T = max(len(s) for s in seqs)
    idx = torch.tensor([[pad_id] * (T - len(s)) + list(s) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[False] * (T - len(s)) + [True] * len(s) for s in seqs])
    return idx, mask


def encode_prompts(enc, prompts):
    """Prompts -> left-padded ids (B, Tp) and mask (B, Tp). Each starts with end-of-text, as every
    document after the first does in the pretraining stream."""
    ids = [[enc.eot_token] + enc.encode_ordinary(p) for p in prompts]
    return pad_left(ids, enc.eot_token)


def response_mask(response, eos):
    """(B, R) True up to and including the first end-of-text; all True for a truncated row."""
    is_eos = (response == eos).long()
    # True where no end-of-text came strictly before t.
    return torch.cumsum(is_eos, 1) - is_eos == 0


def masked_mean(x, mask):
    """Mean over real tokens; positions outside the mask contribute nothing, even NaN or inf."""
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def join_tokens(query, query_mask, response, mask):
    """Per row: the prompt's real tokens followed by the response's real tokens (id lists)."""
    rows = zip(query, query_mask, response, mask)
    return [q[qm].tolist() + r[m].tolist() for q, qm, r, m in rows]
