"""``python bench/learning.py --summarize``: the credit table reprinted from the runs saved in
the repository, and a plain error, naming what is saved, when they cannot answer the arguments."""

from __future__ import annotations

import json

import pytest

from draco_gym.bench.learning import main

TREASURE = ["--layout", "treasure", "--traps", "room", "--threshold", "0.75", "--max-iters", "16", "--k", "0"]


def test_the_saved_treasure_runs_reprint_their_table_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--summarize", *TREASURE, "--rules", "draco,uniform"]) == 0
    printed = capsys.readouterr().out
    # The figures committed with these runs (5 seeds): 1.09x / 1.09x / 1.07x, tabular 1.64x / 1.49x / 1.37x.
    assert " 0.0     1.09x (1.64x)" in printed and " 0.4     1.07x (1.37x)" in printed
    assert printed.rstrip().endswith("uniform/draco iterations at p=0.2: trainer 1.09x (tabular 1.49x)")


@pytest.mark.parametrize("argv, words", [
    ([], ["learning_locks.json: no saved runs", "--out ", "learning_treasure.json --layout treasure",
          "--rules draco,uniform --ps 0.0,0.2,0.4"]),
    ([*TREASURE[:-1], "20", "--rules", "draco,uniform"], ["holds runs of another setting: --k 0 (given: 20)",
                                                           "--k 0 --rules draco,uniform"]),
    ([*TREASURE], ["the saved runs hold no trace at p=0.0", "they hold draco at p=0.0"]),
    ([*TREASURE, "--rules", "draco,uniform", "--ps", "0.2,0.3"], ["hold no draco at p=0.3, uniform at p=0.3"]),
])
def test_saved_runs_that_do_not_match_the_arguments_are_named(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--summarize", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def test_a_damaged_file_is_named(tmp_path, capsys):
    (tmp_path / "runs.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(SystemExit):
        main(["--summarize", "--out", str(tmp_path / "runs.json")])
    assert "runs.json is not a file of saved runs (KeyError" in capsys.readouterr().err
