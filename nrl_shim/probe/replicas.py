"""Replica vs replica, from the job report's records: every engine process notes each refit's weight version
(`{"probe": WeightsProbe.record()}`); replicas of one layout (the same parameters and shard ranks) must hold the same
version after the same number of refits. Read after the job or while it runs (`nrl-shim report`).
"""

from __future__ import annotations


def _where(process: dict, record: dict) -> str:
    ranks = ", ".join(f"{k} {record[k]}" for k in ("tp_rank", "dp_rank") if record.get(k) is not None)
    return f"{process.get('host', '?')} pid {process.get('pid', '?')}" + (f" ({ranks})" if ranks else "")


def latest(processes: list[dict]) -> dict[tuple, tuple[dict, dict, dict[int, str]]]:
    """Per (process file, model): (process, its latest record, {refit: version})."""
    found: dict[tuple, tuple[dict, dict, dict[int, str]]] = {}
    for process in processes:
        for note in process.get("notes", ()):
            record = note.get("probe")
            if not isinstance(record, dict) or "layout" not in record:
                continue
            key = (process.get("file"), record.get("model_id"))
            _, _, versions = found.get(key, (None, None, {}))
            versions[int(record.get("refit", 0))] = str(record.get("version"))
            found[key] = (process, record, versions)
    return found


def compare(processes: list[dict]) -> tuple[list[str], list[str]]:
    """(lines of the probe section, findings among them): per layout, its replicas' refits and versions."""
    groups: dict[str, list[tuple[dict, dict, dict[int, str]]]] = {}
    for process, record, versions in latest(processes).values():
        groups.setdefault(str(record["layout"]), []).append((process, record, versions))
    lines, findings = [], []
    for process in processes:  # what each engine process found at its own refits
        for note in process.get("notes", ()):
            found = note.get("probe_finding")
            if isinstance(found, dict) and found.get("message"):
                finding = f"{_where(process, found)}: " + str(found["message"]).split("] ", 1)[-1]
                findings.append(finding)
                lines.append("FINDING " + finding)
    for layout, replicas in sorted(groups.items()):
        engine = replicas[0][1].get("engine", "?")
        refits = [max(versions) for _, _, versions in replicas]
        lines.append(
            f"{engine} layout {layout}: {len(replicas)} replica(s), refits "
            + ", ".join(f"{_where(p, r)}: {max(v)}" for p, r, v in replicas)
        )
        most = max(refits)
        behind = [(p, r, v) for p, r, v in replicas if max(v) < most]
        if behind and len(behind) < len(replicas):
            finding = (
                f"{engine} layout {layout}: replica(s) with fewer refits than the others ({most}): "
                + ", ".join(f"{_where(p, r)} at {max(v)}" for p, r, v in behind)
                + " (a replica left out of a weight sync, or one restarted and never synced)"
            )
            findings.append(finding)
            lines.append("  FINDING " + finding)
        # Each refit count the replicas share: the versions must agree; the odd ones out (fewest) are named. From refit 1:
        # version 0 is what each engine loaded (dummy weights are not the policy yet).
        shared = set.intersection(*(set(v) for _, _, v in replicas)) - {0} if len(replicas) > 1 else set()
        for refit in sorted(shared):
            holders: dict[str, list[str]] = {}
            for process, record, versions in replicas:
                holders.setdefault(versions[refit], []).append(_where(process, record))
            if len(holders) == 1:
                continue
            ranked = sorted(holders.items(), key=lambda item: -len(item[1]))
            majority = ranked[0][0] if len(ranked[0][1]) > len(ranked[1][1]) else None
            odd = [", ".join(w) for version, w in ranked if version != majority]
            finding = (
                f"{engine} layout {layout}: after refit {refit} the replicas hold different weights: "
                + ("; ".join(odd) + " differ(s) from the others" if majority else "; ".join(odd))
                + " (a replica on other weights: a sync that did not reach it, or weights changed under it)"
            )
            findings.append(finding)
            lines.append("  FINDING " + finding)
            break  # the first refit where they part: later ones follow from it
    return lines, findings
