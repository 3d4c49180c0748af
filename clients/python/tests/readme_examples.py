"""Writes the Python examples of clients/python/README.md to a directory,
one module a block, for ``mypy --strict`` (scripts/test runs it):
``python readme_examples.py OUTDIR``. A block that imports a package not
installed here (celery) is left out, and said so."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def main(out: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    out.mkdir(parents=True, exist_ok=True)
    kept = 0
    for i, code in enumerate(blocks):
        tops = set(re.findall(r"^(?:from|import) (\w+)", code, flags=re.M))
        missing = sorted(t for t in tops if importlib.util.find_spec(t) is None)
        if missing:
            print(f"README example {i}: not checked, needs {', '.join(missing)}")
            continue
        (out / f"readme_example_{i}.py").write_text(code)
        kept += 1
    print(f"{kept} of {len(blocks)} README examples written")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
