"""The committed golden data is what tools/make_goldens.py makes: rerun it and compare bytes."""
import filecmp
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_random_goldens_reproduce_exactly(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_goldens.py"), "--only",
                    "random", "--out", str(tmp_path)], check=True, capture_output=True)
    committed = os.path.join(ROOT, "tests", "testdata")
    for sub in ("goldens", "checkpoints"):
        for dirpath, _, files in os.walk(tmp_path / sub):
            for f in files:
                ours = os.path.join(dirpath, f)
                rel = os.path.relpath(ours, tmp_path)
                assert filecmp.cmp(ours, os.path.join(committed, rel), shallow=False), rel


def test_demo_goldens_reproduce_exactly(tmp_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_goldens.py"), "--only",
                    "demo", "--out", str(tmp_path)], check=True, capture_output=True)
    assert filecmp.cmp(tmp_path / "goldens" / "demo.json",
                       os.path.join(ROOT, "tests", "testdata", "goldens", "demo.json"),
                       shallow=False)
