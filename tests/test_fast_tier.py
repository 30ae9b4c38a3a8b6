"""`make check`'s fast tier leaves out the files of tests/slow_tier.txt: a stale line would hide nothing
and a typo would leave a slow file in the inner loop, so every line must name a test file."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_file_the_fast_tier_leaves_out_exists():
    listed = [line.split("#")[0].strip() for line in (ROOT / "tests" / "slow_tier.txt").read_text().splitlines()]
    listed = [p for p in listed if p]
    assert listed, "tests/slow_tier.txt names no file"
    assert [p for p in listed if not (p.startswith("tests/test_") and (ROOT / p).is_file())] == []
    assert len(listed) == len(set(listed))
