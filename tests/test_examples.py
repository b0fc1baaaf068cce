"""The examples run as a reader runs them: a fresh interpreter, from the repository root, exit 0."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_train_toy_learns_and_reports_a_bleu():
    """A short run of examples/train_toy.py: its loss falls well below where it starts and it ends with a BLEU."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "examples/train_toy.py", "--steps", "60", "--test-sentences", "20"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss (\d+\.\d+)", out.stdout, re.MULTILINE)]
    assert len(losses) == 2, out.stdout                              # steps 1 and 60
    assert losses[-1] < losses[0] - 1.0, losses                      # about 5.9 at step 1, 4.0 at step 60
    bleu = re.search(r"^test BLEU (\S+) on 20 sentences$", out.stdout, re.MULTILINE)
    assert bleu and 0 <= float(bleu.group(1)) <= 100, out.stdout
