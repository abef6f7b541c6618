#!/usr/bin/env python3
"""README.md's clients table checked against the conformance results (target/conformance/*.json).

    python3 conformance/check_table.py CLIENT...    # e.g. rust-sync rust-async python-sync python-asyncio node

Each CLIENT named is one whose runner ran (`make test` names those it ran); its results must be
there. For every row of "The clients side by side" that conformance/table.json maps to topics,
and every column whose cell claims the feature (any cell but one that starts "does not apply"),
every results file of that column's client must show each of those topics with no failed case,
at least one passed, and no case skipped as "unsupported" unless table.json's `known_gaps` lists
it (a gap listed there that now passes must be taken out). A row or a column table.json does
not know fails the check too, so a new one is mapped (or said unchecked) when it is added.
A column whose client did not run here (not named, no results) is reported, not failed.

Exits 1 listing every problem; prints one line per results file checked otherwise.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "target" / "conformance"
TABLE_HEADING = "## The clients side by side"


def table_rows(readme):
    """The table under TABLE_HEADING: (columns, [(feature, {column: cell})])."""
    lines = readme.split(TABLE_HEADING, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, body = rows[0], rows[2:]
    columns = header[1:]
    return columns, [(r[0], dict(zip(columns, r[1:]))) for r in body]


def results_of(client):
    """Every results file of `client` (`client.json`, `client@variant.json`)."""
    files = sorted(RESULTS.glob(f"{client}.json")) + sorted(RESULTS.glob(f"{client}@*.json"))
    return [(f.name, json.loads(f.read_text())) for f in files]


def claims(cell):
    return cell != "" and not cell.lower().startswith("does not apply")


def main(ran):
    table = json.loads((ROOT / "conformance" / "table.json").read_text())
    columns, rows = table_rows((ROOT / "README.md").read_text())
    problems, checked = [], []
    gaps = {(g["client"], g["topic"], g["case"]): g["why"] for g in table["known_gaps"]}
    used_gaps = set()
    topics = sorted(p.stem for p in (ROOT / "conformance" / "cases").glob("*.json"))
    for column in columns:
        if column not in table["columns"]:
            problems.append(f"column {column!r} of README.md's table is not in conformance/table.json's columns")
    for feature, cells in rows:
        if feature in table["not_checked"]:
            continue
        if feature not in table["rows"]:
            problems.append(f"row {feature!r}: map it to its topics in conformance/table.json (rows), or say why not (not_checked)")
            continue
        for column, cell in cells.items():
            client = table["columns"].get(column)
            if client is None or not claims(cell):
                continue
            files = results_of(client)
            if not files:
                if client in ran:
                    problems.append(f"{column}: no results in target/conformance/ for {client} (did its runner run?)")
                continue
            for name, results in files:
                for topic in table["rows"][feature]:
                    r = results["topics"].get(topic)
                    where = f"{feature!r} claimed for {column} ({name}), topic {topic}"
                    if r is None:
                        problems.append(f"{where}: not run")
                        continue
                    if r["failed"]:
                        problems.append(f"{where}: {r['failed']} case(s) failed: {[f['case'] for f in r['failures']]}")
                    if r["passed"] == 0:
                        problems.append(f"{where}: no case passed")
                    for skip in r["skips"]:
                        gap = (client, topic, skip["case"])
                        if skip["kind"] == "unsupported" and gap not in gaps:
                            problems.append(f"{where}: skipped as unsupported, not a known gap: {skip['case']!r} ({skip['reason']})")
                        used_gaps.add(gap)
                    checked.append((name, topic, r["passed"], r["skipped"], r["failed"]))
    for client in ran:
        for name, results in results_of(client):
            missing = [t for t in topics if t not in results["topics"]]
            if missing:
                problems.append(f"{name}: topics not run: {missing}")
    for gap, why in gaps.items():
        client = gap[0]
        if gap not in used_gaps and results_of(client) and client in ran:
            problems.append(f"known gap {gap} ({why}) was not skipped: take it out of conformance/table.json if it passes now")
    per_file = {}
    for name, topic, passed, skipped, failed in set(checked):
        t = per_file.setdefault(name, [0, 0, 0, set()])
        t[0], t[1], t[2] = t[0] + passed, t[1] + skipped, t[2] + failed
        t[3].add(topic)
    for name, (passed, skipped, failed, seen) in sorted(per_file.items()):
        print(f"{name}: the {len(seen)} topics its column claims: {passed} passed, {skipped} skipped, {failed} failed")
    for column in columns:
        client = table["columns"].get(column)
        if client and not results_of(client) and client not in ran:
            print(f"{column}: not checked (its runner did not run here)")
    if problems:
        print("\nREADME.md's clients table and the conformance results disagree:")
        for p in problems:
            print(f"- {p}")
        return 1
    print("README.md's clients table agrees with the conformance results.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
