"""A SQLite tracking store's schema, read before MLflow opens it (no MLflow import): a store of
another stack's, an older or a newer MLflow is refused in one line by the driver's check, and
left as it is. The real stores of both stacks: tests/e2e/test_cross_stack.py."""
import sqlite3

import pytest

from pipelines import stack, tracking
from pipelines.tracking import storeschema

HERE = stack.active().name
OTHER = next(name for name in stack.STACKS if name != HERE)


def store(path, revision=None):
    """A SQLite file with MLflow's ``alembic_version`` table at ``revision`` (``None``: no table)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        if revision is not None:
            db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
            db.execute("INSERT INTO alembic_version VALUES (?)", (revision,))
    return str(path)


def older_revision():
    """A revision of the installed MLflow's schema that is neither stack's: the head's parent's parent."""
    head, graph = storeschema.mlflow_revisions()
    revision = graph[graph[head][0]][0]
    assert storeschema.maker(revision) is None
    return revision


def test_the_stack_table_names_the_installed_mlflows_schema():
    head, graph = storeschema.mlflow_revisions()
    assert head == stack.get(HERE).mlflow_schema
    assert len(graph) > 20 and all(isinstance(down, tuple) for down in graph.values())


def test_a_store_at_this_mlflows_schema_or_without_one_is_not_refused(tmp_path):
    assert storeschema.schema_refusal(store(tmp_path / "here.db", stack.get(HERE).mlflow_schema), "S") is None
    assert storeschema.schema_refusal(store(tmp_path / "half.db"), "S") is None  # MLflow's own error then
    (tmp_path / "new.db").write_bytes(b"")
    assert storeschema.schema_refusal(str(tmp_path / "new.db"), "S") is None


def test_the_other_stacks_store_is_refused_by_the_drivers_check_naming_it(tmp_path):
    path = store(tmp_path / "mlruns.db", stack.get(OTHER).mlflow_schema)
    with pytest.raises(tracking.TrackingUnavailable) as refused:
        tracking.check_store("sqlite:///" + path)
    message = str(refused.value)
    assert f"has schema {stack.get(OTHER).mlflow_schema} of the {OTHER} stack's MLflow" in message
    assert f"track this job on the {OTHER} stack ({stack.venv(OTHER)})" in message and "\n" not in message
    assert storeschema.store_revision(path) == stack.get(OTHER).mlflow_schema


@pytest.mark.parametrize("kind", ["older", "newer"])
def test_a_store_of_an_older_or_newer_mlflow_is_refused_with_the_way_out(tmp_path, kind):
    revision = older_revision() if kind == "older" else "0123456789ab"
    path = store(tmp_path / "mlruns.db", revision)
    message = storeschema.schema_refusal(path, "sqlite:///S")
    assert message.startswith(f"MLflow tracking store sqlite:///S has schema {revision} of an {kind} MLflow") \
        if kind == "older" else message.startswith(f"MLflow tracking store sqlite:///S has schema {revision} of a "
                                                   "newer MLflow, which the ")
    assert "give it its own store (--tracking-uri sqlite:///OTHER.db, or another --output), or pass --no-tracking" \
        in message and "track this job on" not in message
    assert ("or migrate it knowingly with `mlflow db upgrade sqlite:///S`" in message) == (kind == "older")
    assert storeschema.store_revision(path) == revision
