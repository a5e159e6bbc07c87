"""Batch inference on an ETL split through Spark (local[2]) reads private copies of the parts the
manifest names, made from the files checked when the input was planned: the rows all come back,
and the copies' folder is gone afterwards, whether the run succeeded or a part was swapped."""
import os

import pyarrow.parquet as pq
import pytest

from pipelines.io.nofollow import LinkRefused
from pipelines.predict import job
from pipelines.predict.config import PredictConfig
from tests.unit.manifest.test_manifest_checks import RUN, write_output
from tests.unit.manifest.test_open_once import swap_for_folder
from tests.unit.predict.test_predict_model import keras_run

pytestmark = pytest.mark.slow


def leftovers(folder):
    return [name for name in os.listdir(folder) if ".input-" in name]


def test_an_etl_split_is_predicted_from_private_copies_then_removed(spark, tmp_path):
    etl, out = str(tmp_path / "etl"), str(tmp_path / "out.parquet")
    write_output(etl, groups=(2, 1, 2))  # 4-pixel images, as the model takes them
    config = PredictConfig(model=keras_run(tmp_path / "run"), input=os.path.join(etl, "test"), output=out)
    summary = job.run_predict(config, spark)
    assert summary["files"]["rows"] == summary["files"]["predicted"] == pq.read_table(out).num_rows == 4
    assert not leftovers(str(tmp_path))


def test_a_part_swapped_after_planning_is_refused_and_no_copy_is_left(spark, tmp_path, monkeypatch):
    etl, out, marker = str(tmp_path / "etl"), str(tmp_path / "out.parquet"), str(tmp_path / "unpickled")
    write_output(etl, groups=(2, 1, 2))
    config = PredictConfig(model=keras_run(tmp_path / "run"), input=os.path.join(etl, "test"), output=out)
    planned = job.prepare

    def prepare_then_swap(*args):
        spec, plan = planned(*args)
        swap_for_folder(etl, f"runs/{RUN}/test/part-00000.parquet", marker)
        return spec, plan

    monkeypatch.setattr(job, "prepare", prepare_then_swap)
    with pytest.raises(LinkRefused, match="part-00000.parquet"):
        job.run_predict(config, spark)
    assert not leftovers(str(tmp_path)) and not os.path.exists(out) and not os.path.exists(marker)
