"""The console scripts setup.cfg declares: each resolves to a callable, and each stage's is the
``main`` its ``jobs/<stage>.py`` runs."""
import ast
import configparser
import os
from importlib.metadata import EntryPoint

from tests.support.env import REPO


def console_scripts() -> dict:
    """``{name: "module:function"}`` from setup.cfg's ``console_scripts``."""
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    lines = config["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((part.strip() for part in line.split("=", 1)) for line in lines)


def test_every_console_script_resolves_to_a_callable():
    scripts = console_scripts()
    assert {"pipelines-etl", "pipelines-train", "pipelines-predict"} <= set(scripts)
    for name, value in scripts.items():
        assert callable(EntryPoint(name, value, "console_scripts").load()), name


def test_each_stage_script_runs_the_main_of_its_job_file():
    scripts = console_scripts()
    for stage in ("etl", "train", "predict"):
        tree = ast.parse(open(os.path.join(REPO, "jobs", f"{stage}.py")).read())
        imported = [f"{node.module}:{alias.name}" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names if alias.name == "main"]
        assert imported == [scripts[f"pipelines-{stage}"]], stage
