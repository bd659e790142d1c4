#!/usr/bin/env python3
"""Prints the fenced block of a README marked `<!-- readme-test: NAME -->`
(the marker on the line just before the fence), as written: CI runs or
serves it exactly as a reader would paste it. Exits 1 when there is no
such block, or more than one.

Usage: tests/typescript/readme_block.py README NAME
"""

import re
import sys

path, name = sys.argv[1], sys.argv[2]
lines = open(path, encoding="utf-8").read().split("\n")
found = []
for i, line in enumerate(lines):
    marker = re.match(r"\s*<!--\s*readme-test:\s*(.+?)\s*-->\s*$", line)
    if marker and marker.group(1) == name:
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            sys.exit(f"{path}:{i + 1}: the marker {name!r} is not followed by a fenced block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            sys.exit(f"{path}:{i + 2}: the block {name!r} is not closed")
        found.append("\n".join(lines[i + 2 : end]) + "\n")
if len(found) != 1:
    sys.exit(f"{path}: {len(found)} blocks marked readme-test: {name} (need one)")
sys.stdout.write(found[0])
