#!/usr/bin/env python3
"""The layering of src/ (docs/architecture.md, "Floors"): every include of a loco header must
point to the same room or to a room on a lower floor, and no two files may include each other,
directly or around a loop; and no file of the methods' library (build/libloco.a, which the Python
extension links alone) may include one of the CPU engine's library ("Two libraries"; the engine's
files are given as CMakeLists.txt lists them: --engine-units core/blas,... --engine-rooms run,...).
Prints every arrow against the layering and every loop, and exits 1 if there is any. Run by ctest
as layering."""
import os
import re
import sys

# Rooms by floor, lowest first (docs/architecture.md says what each holds).
FLOORS = [
    ["core"],
    ["model", "comm", "data"],
    ["optim", "pipeline"],
    ["io"],
    ["algo"],
    ["elastic", "sim"],
    ["run"],
    ["report", "python"],
    ["cli"],
]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([A-Za-z0-9_./]+)"', re.M)

import argparse

ap = argparse.ArgumentParser()
ap.add_argument("src", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "..", "src"))
ap.add_argument("--engine-units", default="", help="comma-separated room/name of the engine's files (no suffix)")
ap.add_argument("--engine-rooms", default="", help="comma-separated rooms wholly in the engine's library")
args = ap.parse_args()
src = args.src
engine_units = {u for u in args.engine_units.split(",") if u}
engine_rooms = {r for r in args.engine_rooms.split(",") if r}
problems = []
graph = {}
rooms = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
for room in rooms:
    if room not in FLOOR:
        problems.append(f"src/{room}/ is on no floor: add it to tests/layering/check.py and docs/architecture.md")
        continue
    for name in sorted(os.listdir(os.path.join(src, room))):
        if not name.endswith((".h", ".cpp")):
            continue
        path = f"{room}/{name}"
        with open(os.path.join(src, path)) as f:
            text = f.read()
        graph[path] = []
        for to_room, to_file in INCLUDE.findall(text):
            target = f"{to_room}/{to_file}"
            if not os.path.exists(os.path.join(src, target)):
                continue  # not one of loco's (a system header with a slash)
            graph[path].append(target)
            if to_room != room and (to_room not in FLOOR or FLOOR[to_room] >= FLOOR[room]):
                where = FLOOR.get(to_room, "no")
                problems.append(f"src/{path} includes {target}: {to_room} (floor {where}) is not below "
                                f"{room} (floor {FLOOR[room]})")

# Loops among files: a header and its .cpp are one unit (a .cpp includes its own header).
def unit(path):
    return path.rsplit(".", 1)[0]


def library(u):
    """'engine' or 'methods'; None for the program's main, which links both. The subcommands
    (cli/cmd_*) are the engine's; the Python extension links the methods' alone, so it is held
    to their rule."""
    if u == "cli/main":
        return None
    room = u.split("/")[0]
    return "engine" if u in engine_units or room in engine_rooms or room == "cli" else "methods"


for u in sorted(engine_units):
    if not any(unit(p) == u for p in graph):
        problems.append(f"--engine-units names {u}, which is no file of src/")
if engine_units or engine_rooms:
    for path, targets in sorted(graph.items()):
        if library(unit(path)) != "methods":
            continue
        for t in targets:
            if library(unit(t)) == "engine":
                problems.append(f"src/{path} includes {t}: the methods' library would need the CPU engine's")


edges = {}
for path, targets in graph.items():
    edges.setdefault(unit(path), set()).update(unit(t) for t in targets if unit(t) != unit(path))
state, stack = {}, []


def visit(u):
    state[u] = 1
    stack.append(u)
    for v in sorted(edges.get(u, ())):
        if state.get(v) == 1:
            problems.append("include loop: " + " -> ".join(stack[stack.index(v):] + [v]))
        elif v not in state:
            visit(v)
    stack.pop()
    state[u] = 2


sys.setrecursionlimit(10000)
for u in sorted(edges):
    if u not in state:
        visit(u)

for p in problems:
    print("FAIL:", p)
print(f"{len(graph)} files in {len(rooms)} rooms on {len(FLOORS)} floors: {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
