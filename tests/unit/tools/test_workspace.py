"""The notebooks' set-up in one call (pipelines.notebook.setup) over pipelines.tools.workspace."""
import os

from pipelines import notebook as nb
from pipelines.runtime.environment import WORKDIR_ENV
from pipelines.tools import workspace


def test_default_workdir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(WORKDIR_ENV, str(tmp_path / "w"))
    assert workspace.default_workdir() == str(tmp_path / "w")


def test_setup_gives_workdir_data_and_the_runs_shared_config(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(WORKDIR_ENV, str(tmp_path / "work"))
    etl = tmp_path / "work" / "etl"
    etl.mkdir(parents=True)
    (etl / "manifest.json").write_text("{}")  # an existing ETL output is reused as it is
    workdir, data_dir, base = nb.setup("", "", "none", image_size=0, epochs=2, batch_size=4, patience=3)
    assert workdir == str(tmp_path / "work") and data_dir == str(etl)
    assert base == dict(data=str(etl), weights="none", tensorboard=False, image_size=0, epochs=2, batch_size=4,
                        patience=3)
    assert f"data: {etl} | weights: none" in capsys.readouterr().out

    made = tmp_path / "made"
    assert nb.setup(str(made), "/some/etl", "/w.h5").base["weights"] == "/w.h5"
    assert os.path.isdir(made)


def test_an_older_two_split_etl_output_is_made_again_anything_else_is_reused(tmp_path):
    from pipelines.io.storage import resolve
    from pipelines.tools.workspace import _two_splits

    location = resolve(str(tmp_path))
    for splits, older in (({"train": {}, "test": {}}, True), ({"train": {}, "validation": {}, "test": {}}, False)):
        location.join("manifest.json").write_json({"splits": splits})
        assert _two_splits(location) is older
    location.join("manifest.json").write_json({})
    assert not _two_splits(location)
