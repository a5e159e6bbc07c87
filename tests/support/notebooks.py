"""The notebooks run top to bottom with parameters injected papermill-style (nbclient), and
what their cells printed and drew."""
import os

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

from tests.support.env import REPO, dump_python_stacks

NOTEBOOKS = os.path.join(REPO, "notebooks")


def execute(name: str, cwd: str, **parameters) -> nbformat.NotebookNode:
    """Run one notebook with ``parameters`` injected after its ``parameters`` cell; raise on any cell error."""
    book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    index = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    book.cells.insert(index + 1, injected)
    try:
        NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    except CellTimeoutError:  # say where it waits: the CI log is all there is of a hang
        print(outputs(book)[-6000:], dump_python_stacks(), sep="\n")
        raise
    return book


def outputs(book) -> str:
    return "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                     for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []))


def has_image(book) -> bool:
    return any("image/png" in o.get("data", {}) for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []))
