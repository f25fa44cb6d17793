"""The Text space of every message and observation (``envs.base.UnicodeText``): all of
Unicode, checked without building Gymnasium's 1.1-million-entry character tables, which
cost ~210 MiB in every process that builds an environment."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

from draco_gym.envs.base import UnicodeText, text_space


def test_contains_every_scalar_value_and_nothing_else():
    space = UnicodeText(max_length=8, min_length=1)
    for text in ("a", "{\n}\t", "é😀中", "\x00\U0010ffff"):
        assert space.contains(text), text
    assert not space.contains("a\ud800")  # a lone surrogate is no Unicode scalar value
    assert not space.contains("\udfff")
    assert not space.contains("")  # shorter than min_length
    assert not space.contains("x" * 9)  # longer than max_length
    assert not space.contains(b"abc") and not space.contains(None)


def test_equal_spaces_pickle_and_sample_within_bounds():
    space = text_space(max_length=50)
    assert pickle.loads(pickle.dumps(space)) == space
    assert space != UnicodeText(max_length=51)
    sample = space.sample()
    assert space.contains(sample)


def test_building_and_checking_builds_no_character_table():
    """In a fresh interpreter: a space built and asked about a string allocates kilobytes,
    not the ~210 MiB of the tables."""
    script = textwrap.dedent("""
        import tracemalloc
        from draco_gym.envs.base import text_space
        tracemalloc.start()
        space = text_space()
        assert space.contains("print('hi')\\n")
        print(tracemalloc.get_traced_memory()[1])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) < 2**20
