"""The tokenizer: byte-level BPE trained here on the world's text, run by tiktoken; saved, loaded,
or tiktoken's gpt2.

  - `train_bpe(text, vocab_size)` learns merges over GPT-2's pre-tokenized words, most frequent
    pair first
  - `make_encoding(ranks)` turns the merges into a tiktoken Encoding, end-of-text (EOT) as the
    last id
  - `save_ranks` / `load_tokenizer` write and read out_dir/tokenizer.bpe (one "base64 bytes, id"
    a line)
  - `gpt2_missing()`: whether tiktoken's gpt2 encoding loads from its cache alone (asked before
    any work)
Not run on its own: data.py's `build_world` trains it (`python train.py --stage=world`).
Left out: BPE dropout, special tokens other than end-of-text, a faster merge loop (the smoke world
trains in seconds).
"""
import base64, os
from collections import Counter

from machinery import store
from machinery.errors import RunError

EOT = "<|endoftext|>"

# GPT-2's split.
PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

def train_bpe(text, vocab_size):
    """Learn merges over the unique pre-tokenized words of `text` (weighted by count).
    Returns mergeable ranks {token bytes: id} for ids < vocab_size - 1 (the last id is
    end-of-text)."""
    # The regex module is tiktoken's own dependency; it knows \p{L}.
    import regex
    words = {tuple(w.encode("utf-8")): c for w, c in Counter(regex.findall(PAT, text)).items()}
    vocab = {i: bytes([i]) for i in range(256)}
    ranks = {b: i for i, b in vocab.items()}
    while len(ranks) < vocab_size - 1:
        pairs = Counter()
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += c
        if not pairs:
            # Every word is one token already.
            break
        # The most frequent pair, ties broken by id: deterministic.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = vocab[best[0]] + vocab[best[1]]
        # The same bytes reached another way reuse the id.
        new = ranks.setdefault(merged, len(ranks))
        vocab[new] = merged
        words = {_merge(w, best, new): c for w, c in words.items()}
    return ranks

def _merge(w, pair, new):
    out, i = [], 0
    while i < len(w):
        if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
            out.append(new)
            i += 2
        else:
            out.append(w[i])
            i += 1
    return tuple(out)

def make_encoding(ranks):
    import tiktoken
    return tiktoken.Encoding(name="tether-bpe", pat_str=PAT, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})

def save_ranks(ranks, path):
    store.write_text(path, "".join(f"{base64.b64encode(b).decode()} {i}\n"
                                   for b, i in sorted(ranks.items(), key=lambda x: x[1])))

def gpt2_missing():
    """Why tiktoken cannot load its gpt2 encoding without the network, in one line; None when it can
    (train.py's parse asks before any work). tiktoken reads each file it needs from its cache
    ($TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR, else <tmp>/data-gym-cache; named by the sha1 of
    the file's URL, checked by its sha256) and downloads it with `tiktoken.load.read_file` only when
    the cache lacks it: here that download fails at once, so nothing is fetched and nothing waits on
    the network."""
    import tiktoken, tiktoken.load

    def offline(url):
        raise OSError(f"{url} is not in tiktoken's cache")
    fetch, tiktoken.load.read_file = tiktoken.load.read_file, offline
    try:
        # Kept by tiktoken: load_tokenizer gets it again for free.
        tiktoken.get_encoding("gpt2")
        return None
    # Offline's OSError, or tiktoken's own (then said).
    except Exception as e:
        why = "" if isinstance(e, OSError) else f" ({type(e).__name__}: {e})"
        return ("--tokenizer=gpt2 needs tiktoken's gpt2 files and its cache does not hold "
                f"them{why}: run python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\" "
                "once with the network, or use --tokenizer=bpe")
    finally:
        tiktoken.load.read_file = fetch


def load_tokenizer(out_dir, name="bpe"):
    """The run's tokenizer: our BPE from out_dir/tokenizer.bpe, or tiktoken's gpt2 if it is cached
    locally."""
    if name == "gpt2":
        import tiktoken
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise SystemExit("error: tiktoken's gpt2 encoding is not available offline "
                             f"({type(e).__name__}); use --tokenizer=bpe")
    if name != "bpe":
        raise SystemExit(f"error: unknown tokenizer {name!r} (choose bpe or gpt2)")
    path = os.path.join(out_dir, "tokenizer.bpe")
    try:
        with open(path) as f:
            ranks = {base64.b64decode(b): int(i) for b, i in (line.split() for line in f)}
        return make_encoding(ranks)
    except Exception as e:
        raise RunError(f"cannot read {path} ({type(e).__name__}): redo the world stage (--fresh)")
