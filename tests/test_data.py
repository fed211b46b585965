"""The world: generator, recognizer, gold scorer, annotator, tokenizer."""
import random
import numpy as np
import pytest
import data, tokenizer

P = "review: the pasta place on main street\n"
E = data.EOT


def test_generated_reviews_are_wellformed():
    rng = random.Random(0)
    for _ in range(2000):
        prompt, body = data.sample_review(rng).split("\n", 1)
        v = data.judge(prompt + "\n", body + E)
        assert v["wellformed"], body
        assert 1 <= v["n_sentences"] <= 4


def test_world_is_rich_enough():
    assert len(data.DOMAINS) >= 8 and len(data.SHAPES) >= 20
    pos = set(data.POS) | {w for w, v in data.DOMAIN_ADJ.items() if v > 0}
    neg = set(data.NEG) | {w for w, v in data.DOMAIN_ADJ.items() if v < 0}
    assert len(pos) >= 40 and len(neg) >= 40 and data.NEUTRAL
    # glowing reviews are a minority of the corpus
    rng = random.Random(1)
    sent = [data.judge(*(lambda p, b: (p + "\n", b + E))(*data.sample_review(rng).split("\n", 1)))["sentiment"]
            for _ in range(1000)]
    assert np.mean(np.array(sent) > 1.5) < 0.25


def test_recognizer_rejects_what_the_grammar_cannot_make():
    assert data.parse_sentence("the pasta was very tasty.") is not None
    for s in ["the pasta was very very tasty.", "tasty was the pasta.", "the pasta was tasty", "asdf.",
              "the pasta was tastyy.", ""]:
        assert data.parse_sentence(s) is None, s


def gold(body, eot=True):
    return data.gold_score(P, body + (E if eot else ""))


def test_gold_negation_and_intensifiers():
    assert gold("the pasta was tasty.") > gold("the pasta was not tasty.")
    assert gold("the pasta was not awful.") > gold("the pasta was awful.")
    assert gold("the pasta was very tasty.") > gold("the pasta was tasty.") > gold("the pasta was slightly tasty.")
    assert gold("i did not like the pasta.") < gold("i liked the pasta.")
    assert gold("the pasta was never bland.") > gold("the pasta was bland.")


def test_gold_contrast_mixes_sentiment():
    mixed = gold("the pasta was tasty but the waiter was rude.")
    assert gold("the pasta was tasty, and the waiter was friendly.") > mixed > gold("the pasta was bland, and the waiter was rude.")


def test_gold_off_domain_words_and_aspects():
    assert gold("the pasta was snappy.") < gold("the pasta was tasty.") - 2      # a phone word for food
    assert gold("the camera was sharp.") < gold("the dessert was fresh.") - 2    # a phone aspect in a restaurant
    assert not data.is_wellformed(P, "the pasta was snappy." + E)


def test_gold_prefers_specific_varied_review_over_stock_line():
    stock = gold("overall it was lovely.")
    specific = gold("the pasta was very tasty. the waiter was friendly. the dessert was excellent.")
    repetitive = gold("the pasta was tasty. the pasta was tasty. the pasta was tasty.")
    broken = gold("the pasta was tasty the the was. qq zz")
    assert specific > stock + 1.0
    assert repetitive < stock - 1.0 and broken < stock - 1.0
    assert gold("overall it was extremely excellent.") < specific


def test_gold_is_total_and_bounded():
    lo, hi = data.GOLD_RANGE
    cases = ["", E, "\x00\xff\ud7ff garbage ☃☃", "the pasta was tasty." * 50, "." * 1000, "review: x\n" * 5]
    for body in cases:
        for prompt in [P, "", "nonsense header"]:
            s = data.gold_score(prompt, body)
            assert lo <= s <= hi and np.isfinite(s)
    assert gold("") < gold("the pasta was tasty.")
    assert gold("the pasta was tasty.", eot=False) < gold("the pasta was tasty.")     # missing end-of-text
    assert gold(" ".join(["the pasta was tasty.", "the soup was fresh.", "the bread was good.", "the salad was nice.",
                          "the sauce was great.", "the dessert was fine."])) < \
        gold("the pasta was tasty. the soup was fresh. the bread was good. the salad was nice.")   # too long


def test_annotator_agreement_near_target():
    rng, lab = random.Random(3), random.Random(4)
    agree = n = 0
    for _ in range(3000):
        s = rng.choice(sorted(data.SUBJECT_DOMAIN))
        a, b = (data.sample_review(rng, s).split("\n", 1)[1] + E for _ in range(2))
        p = f"review: {s}\n"
        ga, gb = data.gold_score(p, a), data.gold_score(p, b)
        if ga != gb:
            n += 1
            agree += (data.label_pair(p, a, b, lab) == 0) == (ga > gb)
    assert 0.75 <= agree / n <= 0.85


def test_bpe_roundtrip_and_determinism(tmp_path):
    text = "\n".join(data.sample_review(random.Random(5)) for _ in range(300))
    r1, r2 = tokenizer.train_bpe(text, 400), tokenizer.train_bpe(text, 400)
    assert r1 == r2 and len(r1) <= 399
    enc = tokenizer.make_encoding(r1)
    for s in [text, "héllo wörld ☃ 日本語 🙂 \t\n  x", "".join(chr(i) for i in range(32, 2000, 7)), ""]:
        assert enc.decode(enc.encode_ordinary(s)) == s
    assert enc.decode([enc.eot_token]) == E
    tokenizer.save_ranks(r1, tmp_path / "tokenizer.bpe")
    enc2 = tokenizer.load_tokenizer(str(tmp_path))
    assert enc2.encode_ordinary(text) == enc.encode_ordinary(text)
    assert len(enc.encode_ordinary(text)) < len(text.encode()) / 2          # merges compress the world's text


def test_unknown_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown tokenizer"):
        tokenizer.load_tokenizer(str(tmp_path), "nope")
