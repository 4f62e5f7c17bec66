"""modserve-bench --paired_steps: every decode point gets its paired table, whose bands together
hold exactly the requested number of pairs, each band's median pass rate inside the band and its
shares ordered (lower quartile <= median <= upper quartile); without the flag there is no such
table, and the flag is refused where it cannot apply.
Usage: bench_paired_steps_test.py BENCH MODEL_DIR"""

import re
import subprocess
import sys
import unittest

ARGS = {}
ROW = re.compile(r"^\| demo \| (\d+) \| (\d+) \| (\d+)-(\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| "
                 r"(\d+)% \| (\d+)-(\d+)% \|$")


def run_bench(*extra):
    return subprocess.run([ARGS["bench"], "--model", ARGS["model"], "--batches", "1,2",
                           "--contexts", "8,24", "--steps", "2", "--threads", "2",
                           "--prefill_reps", "0", *extra],
                          capture_output=True, text=True, timeout=300)


class PairedStepsTest(unittest.TestCase):
    def test_each_point_holds_its_pairs(self):
        p = run_bench("--paired_steps", "5")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("demo: decode steps against the read pass just before each (5 pairs",
                      p.stdout)
        pairs = {}
        for line in p.stdout.splitlines():
            m = ROW.match(line)
            if not m:
                continue
            ctx, batch, lo, hi, n = (int(m.group(i)) for i in range(1, 6))
            pass_rate, step_rate = float(m.group(6)), float(m.group(7))
            share, q1, q3 = int(m.group(8)), int(m.group(9)), int(m.group(10))
            self.assertEqual(hi - lo, 10, line)
            # The median is printed to 0.1 GB/s, so one just under the band's top reads as it.
            self.assertTrue(lo <= pass_rate <= hi, line)
            # (A 3 MB step that a loaded machine stalls for 70 ms prints as 0.0 GB/s.)
            self.assertGreaterEqual(step_rate, 0, line)
            self.assertTrue(0 <= q1 <= share <= q3, line)
            pairs[(ctx, batch)] = pairs.get((ctx, batch), 0) + n
        self.assertEqual(pairs, {(8, 1): 5, (8, 2): 5, (24, 1): 5, (24, 2): 5}, p.stdout)

    def test_no_table_without_the_flag(self):
        p = run_bench()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertNotIn("read pass just before each", p.stdout)

    def test_refused_where_it_cannot_apply(self):
        for args, words in [(["--paired_steps", "-1", "--model", ARGS["model"]], ">= 0"),
                            (["--paired_steps", "3", "--backend", "cuda", "--model", ARGS["model"]],
                             "CPU's memory only")]:
            with self.subTest(args=args):
                p = subprocess.run([ARGS["bench"], *args], capture_output=True, text=True,
                                   timeout=60)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("--paired_steps", p.stderr)
                self.assertIn(words, p.stderr)


if __name__ == "__main__":
    ARGS.update(zip(["bench", "model"], sys.argv[1:3]))
    del sys.argv[1:3]
    unittest.main()
