"""lab/archive.py: which kept run stands for a suite's run when the base is not on this machine, and the pretrained
model's kept evaluations."""
import os

import pytest
import torch

import train
from lab import archive
from machinery import store
from machinery.errors import RunError
from pipeline import stages


def kept(folder, cfg, st, pretrain, reward="r", outputs=("ppo.json",)):
    """A kept run of cfg under folder/inputs_HASH, made on the base (pretrain, reward)."""
    values, defaults = stages.stamp_config(cfg, st)
    inputs = {"pretrain.pt": pretrain, "reward.pt": reward}
    d = archive.inputs_folder(folder, inputs)
    os.makedirs(d, exist_ok=True)
    hashes = {}
    for n in outputs:
        store.write_text(os.path.join(d, n), "{}")
        hashes[n] = store.file_hash(os.path.join(d, n))
    store.save_json(os.path.join(d, archive.RECORD), dict(
        config=values, defaults=defaults, inputs=inputs, outputs=hashes, code={},
        made_on=dict(cpu="CPU", avx512=False, native_bf16=False, commit="abc", date="d")))
    return d


def test_a_kept_run_stands_in_only_under_its_own_config_with_its_files_intact(tmp_path):
    """candidates: a record made under another flag, or whose kept file changed, is no candidate; the others are,
    whatever base they were made on."""
    st = stages.BY_NAME["ppo"]
    cfg = train.parse(["--seed=7", "--init_kl_coef=0.1"])
    other = train.parse(["--seed=7", "--init_kl_coef=0.2"])
    a = kept(tmp_path / "s", cfg, st, "p1")
    kept(tmp_path / "s", cfg, st, "p2")
    kept(tmp_path / "s", other, st, "p3")
    assert {rec["inputs"]["pretrain.pt"] for _, rec in archive.candidates(tmp_path / "s", cfg, st, ["ppo.json"])} \
        == {"p1", "p2"}
    store.write_text(os.path.join(a, "ppo.json"), "{changed}")
    assert [rec["inputs"]["pretrain.pt"] for _, rec in archive.candidates(tmp_path / "s", cfg, st, ["ppo.json"])] \
        == ["p2"]
    # The threads are part of the config: a run made with 1 thread stands in only for 1 thread.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        kept(tmp_path / "t", train.parse(["--seed=8"]), st, "p1")
        torch.set_num_threads(2)
        assert archive.candidates(tmp_path / "t", train.parse(["--seed=8"]), st, ["ppo.json"]) == []
    finally:
        torch.set_num_threads(threads)


def test_one_base_for_the_whole_table_and_what_it_lacks_named():
    """choose: the base with the most runs (or the one --base names by a prefix of its hash); a run kept only on
    another base is missing, never mixed in; a prefix that matches two pretrained models is refused."""
    def rec(p):
        return ("folder_" + p, {"inputs": {"pretrain.pt": p, "reward.pt": "r"}})
    found = {"a": [rec("aa11"), rec("bb22")], "b": [rec("aa11")], "c": [rec("bb22")], "d": [], "e": [rec("aa11")]}
    base, chosen, missing = archive.choose(found)
    assert base == ("aa11", "r") and set(chosen) == {"a", "b", "e"} and missing == ["c", "d"]
    base, chosen, missing = archive.choose(found, "bb")
    assert base == ("bb22", "r") and chosen["a"][0] == "folder_bb22" and missing == ["b", "d", "e"]
    with pytest.raises(RunError, match="give more of its hash"):
        archive.choose({"a": [rec("ab1"), rec("ab2")]}, "ab")
    with pytest.raises(RunError, match="no kept run"):
        archive.choose({"a": [rec("ab1")]}, "zz")
    assert archive.choose({"a": []}) == (None, {}, ["a"])
    # As many runs on two bases: the user names one.
    with pytest.raises(RunError, match=r"1 of this table's runs on each of 2 pretrained models \(aa11, bb22\): "
                                       "name one with --base=HASH"):
        archive.choose({"a": [rec("aa11")], "b": [rec("bb22")]})
    assert archive.choose({"a": [rec("aa11")], "b": [rec("bb22")]}, "bb")[0] == ("bb22", "r")
    # --base given: no tie is refused (two reward models of one pretrained model: the first).
    def rec2(r):
        return ("folder_" + r, {"inputs": {"pretrain.pt": "aa11", "reward.pt": r}})
    assert archive.choose({"a": [rec2("r1")], "b": [rec2("r2")]}, "aa")[0] == ("aa11", "r1")


def test_every_pretrained_model_s_runs_come_from_the_machine_that_made_the_main_ones():
    """choose_groups: the main group's base first (the most runs), then each other group's base made on the same
    machine as the main runs, even where another machine's base has more runs of that group."""
    def rec(p, cpu):
        return ("f_" + p, {"inputs": {"pretrain.pt": p, "reward.pt": "r"},
                           "made_on": dict(cpu=cpu, avx512=True, native_bf16=True)})
    found = {("main", 1): [rec("m1", "A")], ("main", 2): [rec("m1", "A")],
             ("model2", 1): [rec("x1", "A"), rec("y1", "B")], ("model2", 2): [rec("y1", "B")]}
    chosen, missing, bases = archive.choose_groups(found, lambda k: k[0])
    assert bases == {"main": ("m1", "r"), "model2": ("x1", "r")} and missing == [("model2", 2)]
    assert chosen[("model2", 1)][0] == "f_x1"


def test_the_pretrained_evaluations_are_found_by_config_and_base(tmp_path):
    """keep_pretrained then kept_pretrained: found under the same config, by the base's input hashes or by its
    (pretrained, reward) hashes; another config or base finds nothing."""
    cfg = train.parse(["--seed=7"])
    config = archive.pretrained_config(cfg, [7, 8], dict(bon=[12, 256]))
    inputs = {"pretrain.pt": "p", "reward.pt": "r", "prompts.json": "q"}
    archive.keep_pretrained(tmp_path, config, inputs, dict(starts={"7": 1}), 1.0, "cpu")
    assert archive.kept_pretrained(tmp_path, config, inputs=inputs)["values"] == dict(starts={"7": 1})
    # Another config's evaluations are kept beside them, never over them; the same values are not rewritten.
    other = dict(config, seeds=[7])
    archive.keep_pretrained(tmp_path, other, inputs, dict(starts={"7": 2}), 1.0, "cpu")
    assert archive.kept_pretrained(tmp_path, config, inputs=inputs)["values"] == dict(starts={"7": 1})
    assert archive.kept_pretrained(tmp_path, other, inputs=inputs)["values"] == dict(starts={"7": 2})
    [path] = [os.path.join(d, archive.PRETRAINED) for d in tmp_path.glob("inputs_*")
              if archive.kept_pretrained(tmp_path, config, inputs=inputs) == store.load_json(
                  os.path.join(d, archive.PRETRAINED))]
    made = store.load_json(path)["made_on"]
    archive.keep_pretrained(tmp_path, config, inputs, dict(starts={"7": 1}), 9.0, "cpu")
    assert store.load_json(path)["made_on"] == made
    assert archive.kept_pretrained(tmp_path, config, base=("p", "r"))["values"] == dict(starts={"7": 1})
    assert archive.kept_pretrained(tmp_path, config, base=("p", "x")) is None
    assert archive.kept_pretrained(tmp_path, dict(config, eval_n=5), inputs=inputs) is None
    assert archive.kept_pretrained(tmp_path / "none", config) is None
