"""``--weights imagenet`` offline under real ``horovodrun -np 2``: rank 0 alone says why, before
TensorFlow (the resolution itself: tests/unit/training/model/test_imagenet.py; offline as
there: an empty HOME, a proxy at a local port that refuses every connection)."""
import os
import subprocess
import sys

import pytest

from tests.support.env import BIN, REPO
from tests.support.offline import manifest, offline_env


@pytest.mark.slow
def test_under_horovodrun_rank_0_alone_refuses_offline_weights(tmp_path, refused_port):
    """Real horovodrun -np 2: rank 0 says why once, before TensorFlow; horovodrun exits 1 (README)."""
    home = tmp_path / "home"
    home.mkdir()
    cmd = [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
           os.path.join(REPO, "jobs", "train.py"), "--data", manifest(tmp_path / "etl"), "--output",
           str(tmp_path / "out"), "--batch-size", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=offline_env(home, refused_port), timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Exit code: 2" in text, text[-3000:]
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "[train rank 0]" in errors[0] and "--weights imagenet" in errors[0], text[-3000:]
    assert "Downloading data from" not in text and os.listdir(home / ".keras" / "models") == []
