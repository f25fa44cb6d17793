"""The draco-gym command itself and the demo the README names."""

import subprocess
import sys

from draco_gym.cli import SUBCOMMANDS, main


def draco(*args):
    return subprocess.run([sys.executable, "-m", "draco_gym.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_subcommand():
    result = draco("--help")
    assert result.returncode == 0
    for name in SUBCOMMANDS:
        assert name in result.stdout


def test_unknown_command_is_named():
    result = draco("trian")
    assert result.returncode == 2 and "invalid choice: 'trian'" in result.stderr


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_demo_scores_a_group_and_prints_credit(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "careful: success=True" in out and "guesses: success=False" in out
    # The careful agent is the group's winner and the guesser its loser.
    a = {line.split(":")[0]: float(line.split("A=")[1]) for line in out.splitlines() if " A=" in line}
    assert a["careful"] > 0 > a["guesses"]
