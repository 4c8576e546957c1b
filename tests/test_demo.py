"""The README's main command: the elastic resume demo on real text."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo(workdir, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "scripts/elastic_demo.py", "--workdir", str(workdir), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_elastic_demo_matches_every_step_across_two_resumes(tmp_path):
    result = _demo(tmp_path, "--steps", "6", "--schedule", "2:2,4:4,1:6")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6/6 global steps identical" in result.stdout
    assert os.path.exists(tmp_path / "state_step4.json")


def test_elastic_demo_rejects_a_bad_schedule(tmp_path):
    result = _demo(tmp_path, "--steps", "6", "--schedule", "3:6")
    assert result.returncode != 0 and "RANKS dividing 8 lanes" in result.stderr
