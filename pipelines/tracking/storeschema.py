"""Which MLflow a SQLite tracking store belongs to, read with `sqlite3` before MLflow opens it."""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import os
import sqlite3
from importlib.metadata import version
from typing import Any, Dict, Optional, Tuple

from pipelines import stack

MIGRATIONS = os.path.join("store", "db_migrations", "versions")  # in the mlflow package


def store_revision(path: str) -> Optional[str]:
    """The alembic revision the SQLite store file ``path`` records, or ``None``; `sqlite3.Error` if no database."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)) as db:
        if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'").fetchone():
            return None
        row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


@functools.lru_cache(maxsize=1)
def mlflow_revisions() -> Tuple[str, Dict[str, Tuple[str, ...]]]:
    """``(head, {revision: down revisions})`` from MLflow's migration scripts; `LookupError` without one head."""
    spec = importlib.util.find_spec("mlflow")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("MLflow is not installed")
    folder = os.path.join(list(spec.submodule_search_locations)[0], MIGRATIONS)
    graph: Dict[str, Tuple[str, ...]] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                values = _assignments(f.read())
            if isinstance(values.get("revision"), str):
                down = values.get("down_revision")
                graph[values["revision"]] = tuple(down) if isinstance(down, (tuple, list)) else (down,) if down else ()
    heads = set(graph) - {down for downs in graph.values() for down in downs}
    if len(heads) != 1:
        raise LookupError(f"MLflow's migration scripts in {folder} have {len(heads)} heads")
    return heads.pop(), graph


def _assignments(source: str) -> Dict[str, Any]:
    """Module-level ``name = <literal>`` assignments of a Python source."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def maker(revision: str) -> Optional[str]:
    """The stack whose MLflow leaves a store at ``revision`` (its ``mlflow_schema``), or ``None``."""
    return next((s.name for s in stack.STACKS.values() if s.mlflow_schema == revision), None)


def schema_refusal(path: str, shown: str) -> Optional[str]:
    """Why the installed MLflow may not open the SQLite store ``path`` (``shown``: its URI), in one line; else ``None``.

    MLflow would migrate an older store unasked (its maker could no longer open it) and knows no newer revision.

    Raises:
        sqlite3.Error: ``path`` is no SQLite database.
        LookupError: as `mlflow_revisions`."""
    revision = store_revision(path)
    head, graph = mlflow_revisions()
    if revision is None or revision == head:
        return None
    made_by = maker(revision)
    try:
        here = stack.active().name
    except stack.UnknownStack:  # an interpreter of neither stack: its MLflow alone
        here = ""
    mine = (f"the {here} stack's" if here else "this") + f" MLflow {version('mlflow')} (schema {head})"
    origin = (_mlflow_of(made_by) if made_by else "an older MLflow" if revision in graph else "a newer MLflow")
    ways = (f"track this job on the {made_by} stack ({stack.venv(made_by)}), " if made_by else "") + (
        "give it its own store (--tracking-uri sqlite:///OTHER.db, or another --output), or pass --no-tracking")
    if revision not in graph:
        return f"MLflow tracking store {shown} has schema {revision} of {origin}, which {mine} cannot read: {ways}"
    return (f"MLflow tracking store {shown} has schema {revision} of {origin}; {mine} would migrate it on opening, "
            f"after which {origin} could no longer open it: {ways}; or migrate it knowingly with "
            f"`mlflow db upgrade {shown}`")


def _mlflow_of(name: str) -> str:
    """``the mission stack's MLflow 2.22.5``, from its pins."""
    return f"the {name} stack's MLflow {stack.pins(name).get('mlflow')}"
