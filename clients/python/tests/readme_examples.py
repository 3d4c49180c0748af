"""Writes the Python examples of clients/python/README.md and of the
repository's README.md (its Workers section) to a directory, one module a
block, for ``mypy --strict`` (scripts/test runs it):
``python readme_examples.py OUTDIR``. A block that imports a package not
installed here (celery) is left out, and said so."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

READMES = (Path(__file__).resolve().parents[1] / "README.md", Path(__file__).resolve().parents[3] / "README.md")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    kept = total = 0
    for n, readme in enumerate(READMES):
        blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
        total += len(blocks)
        for i, code in enumerate(blocks):
            tops = set(re.findall(r"^(?:from|import) (\w+)", code, flags=re.M))
            missing = sorted(t for t in tops if importlib.util.find_spec(t) is None)
            if missing:
                print(f"{readme.name} example {i}: not checked, needs {', '.join(missing)}")
                continue
            (out / f"readme{n}_example_{i}.py").write_text(code)
            kept += 1
    print(f"{kept} of {total} README examples written")

if __name__ == "__main__":
    main(Path(sys.argv[1]))
