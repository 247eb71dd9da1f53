#!/usr/bin/env python3
"""Fails where a part of the daemon includes a header of a part it does not build on.

Usage: check_daemon_layers.py SOURCE_DIR LAYERS_FILE

LAYERS_FILE (written by daemon/parts.cmake) has one line per part, "folder: part part ...",
naming the parts it links. A part may include its own headers and those of every part it
builds on, directly or through others; never one above it, nor daemon/main.cpp's.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"daemon/(.+)/[^/]+"', re.MULTILINE)


def read_layers(path):
    layers = {}
    for line in pathlib.Path(path).read_text().splitlines():
        if line.strip():
            folder, _, parts = line.partition(":")
            layers[folder.strip()] = parts.split()
    return layers


def beneath(layers, folder, seen=()):
    """Every part `folder` builds on, directly or not; a cycle is an error."""
    below = set()
    for part in layers[folder]:
        if part == folder or part in seen:
            sys.exit(f"daemon layers: {folder} and {part} build on each other")
        if part not in layers:
            sys.exit(f"daemon layers: {folder} names {part}, which is no part")
        below |= {part} | beneath(layers, part, seen + (folder,))
    return below


def main():
    source, layers_file = pathlib.Path(sys.argv[1]), sys.argv[2]
    layers = read_layers(layers_file)
    wrong = []
    for folder in layers:
        allowed = {folder} | beneath(layers, folder)
        for path in sorted((source / "daemon" / folder).glob("*")):
            if path.suffix not in (".h", ".cpp", ".capnp"):
                continue
            for included in INCLUDE.findall(path.read_text()):
                if included not in allowed:
                    wrong.append(f"{path.relative_to(source)}: includes a header of daemon/"
                                 f"{included}, which {folder} does not build on "
                                 f"(daemon/parts.cmake)")
    for line in wrong:
        print(line, file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
