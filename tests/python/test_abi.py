#!/usr/bin/python3
"""The constants the Python package mirrors are the C header's."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
from gradsync import _core  # noqa: E402

header = open(os.path.join(ROOT, "include", "gradsync", "gradsync.h")).read()
values = {name: int(value) for name, value in re.findall(r"GRADSYNC_(\w+) = (\d+)", header)}
mismatches = []
for name, value in values.items():
    python_name = name[4:] if name.startswith("ERR_") else name
    python_name = "ERR_" + python_name if name.startswith("ERR_") else python_name
    if name in ("SUM", "AVG", "MIN", "MAX", "PROD", "BAND", "BOR", "BXOR"):
        if _core.OPS[name.lower()] != value:
            mismatches.append(name)
    elif getattr(_core, python_name, None) != value:
        mismatches.append(f"{name}: header {value}, python {getattr(_core, python_name, None)}")
if mismatches or len(values) < 20:
    print("mismatched constants:", mismatches, "parsed", len(values))
    sys.exit(1)
print(f"{len(values)} constants match")
