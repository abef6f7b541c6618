#!/usr/bin/env python3
"""Writes the case files in one layout (a step per line), so a diff shows the steps changed.

    python3 conformance/format.py conformance/cases/*.json          # rewrite
    python3 conformance/format.py --check conformance/cases/*.json  # exit 1 if a file is not in it
"""

import json
import sys


def fmt(d):
    out = ["{", f'  "topic": {json.dumps(d["topic"])},', f'  "description": {json.dumps(d["description"])},', '  "cases": [']
    cases = []
    for c in d["cases"]:
        lines = ["    {", f'      "description": {json.dumps(c["description"])},']
        if "needs" in c:
            lines.append(f'      "needs": {json.dumps(c["needs"])},')
        lines.append('      "steps": [')
        lines.append(",\n".join("        " + json.dumps(s) for s in c["steps"]))
        lines += ["      ]", "    }"]
        cases.append("\n".join(lines))
    out += [",\n".join(cases), "  ]", "}"]
    return "\n".join(out) + "\n"


def main(args):
    check = "--check" in args
    bad = []
    for path in (a for a in args if a != "--check"):
        with open(path) as f:
            text = f.read()
        want = fmt(json.loads(text))
        if text != want:
            if check:
                bad.append(path)
            else:
                with open(path, "w") as f:
                    f.write(want)
    if bad:
        print("not in the layout of conformance/format.py (run it on them):", *bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
