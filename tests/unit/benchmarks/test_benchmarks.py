"""A benchmark's bad flag refused before Spark, in one line (the benchmarks run end to end:
tests/e2e/test_benchmarks.py)."""
import os
import subprocess
import sys

import pytest

from tests.support.env import REPO as ROOT, subprocess_env


@pytest.mark.parametrize("flag, says", [("binaryfile,nosuch", "--peers binaryfile,nosuch: unknown nosuch"),
                                        ("Image", "--peers Image: unknown Image"), (",", "--peers names no peer"),
                                        ("none,image", "--peers none,image: unknown none")])
def test_an_unknown_etl_peer_exits_2_in_one_line_listing_the_names_before_spark(flag, says):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "etl_bench.py"), "--peers", flag],
                            cwd=ROOT, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"etl_bench.py: {says}; choose from binaryfile, image (or none)"]


def test_etl_peers_are_taken_once_each_in_the_order_named():
    from benchmarks.etl_peers import PEERS, pick_peers

    assert PEERS == ("binaryfile", "image")
    assert pick_peers("image, binaryfile,image") == ("image", "binaryfile") and pick_peers("none") == ()


def test_trainer_benchmark_refuses_an_unknown_trainer_in_one_line_naming_the_trainers():
    """Refused by the options alone (exit 2, before any sample, Spark or rank), the names listed."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "trainer_bench.py"),
                             "--trainers", "horovod,ray"], cwd=ROOT, capture_output=True, text=True,
                            env=subprocess_env(), timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == ["trainer_bench.py: --trainers horovod,ray: unknown ray; "
                                          "choose from horovod, mwms"]


def test_png_benchmark_refuses_an_unknown_case_in_one_line_naming_the_cases():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "png_bench.py"), "--cases",
                             "photo,bomb"], cwd=ROOT, capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == ("png_bench.py: error: --cases photo,bomb: unknown bomb; choose from "
                                              "photo, 64-ztxt, 5000-ztxt, 1gib-ztxt, tiny-chunks, max-pixels")


def test_png_benchmark_measures_a_photo_and_a_hostile_file():
    """Two of its cases end to end, each decoded in its own process: kept, and rejected at 64 MiB inflated."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "png_bench.py"), "--cases",
                             "photo,5000-ztxt"], cwd=ROOT, capture_output=True, text=True, env=subprocess_env(),
                            timeout=120)
    assert result.returncode == 0, result.stderr
    photo, hostile = result.stdout.splitlines()
    assert photo.startswith("photo ") and photo.endswith("0.0 MiB inflated  kept, 0 chunks dropped"), photo
    assert "64.0 MiB inflated  rejected: damaged PNG: more than 64 of its chunks" in hostile, hostile
