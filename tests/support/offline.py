"""An offline machine, whatever network this one has: an empty Keras home, and every HTTP(S)
request through a proxy at a local port that refuses connections (--weights imagenet's
refusals), and an ETL output's manifest without its Parquet files, for refusals before any read."""
import json

from tests.support.env import subprocess_env


def offline(home, port) -> dict:
    """The variables of an offline machine whose Keras cache is under ``home`` (KERAS_HOME unset)."""
    proxy = f"http://127.0.0.1:{port}"
    return {"HOME": str(home), "https_proxy": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy,
            "HTTP_PROXY": proxy, "no_proxy": "", "NO_PROXY": ""}


def offline_env(home, port, **extra) -> dict:
    """A child job's environment on such a machine."""
    env = subprocess_env(**offline(home, port), **extra)
    env.pop("KERAS_HOME", None)
    return env


def manifest(folder) -> str:
    """An ETL output's manifest that 2 ranks can train on (no Parquet file: nothing reads them)."""
    m = {"image": {"height": 32}, "num_classes": 3, "class_names": ["a", "b", "c"], "rows_per_row_group": 2,
         "splits": {"train": {"rows": 100, "row_groups": 8}, "validation": {"rows": 20, "row_groups": 8},
                    "test": {"rows": 20, "row_groups": 8}}}
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(m))
    return str(folder)
