"""The figures README and docs quote are the committed results' rows: each is read here from results/ and looked for,
formatted as the text quotes it, in the page that quotes it (the fleet, the batch job, the soaks, a 32K document's
first question)."""

from __future__ import annotations

import json
import re

import yaml
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "results" / "bench"


def _text(name: str) -> str:
    """A page with its line breaks and indentation folded into single spaces."""
    return " ".join((ROOT / name).read_text().split())


def _table(path: Path, first: str) -> dict[str, dict[str, str]]:
    """The markdown table of `path` whose header starts with `first`, by its first column."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and line.strip("| ").startswith(first))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if not line.startswith("|") or len(cells) != len(header):
            break  # the table ends
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_the_fleet_figures_are_fleet_txt_rows():
    rows = _table(BENCH / "fleet.txt", "arm")
    ms = "compress ms, median of steps 25-30"
    fleet, alone, cold = rows["fleet"], rows["alone"], rows["cold"]
    ratio = re.search(r"fleet / alone, median of steps 25-30: ([\d.]+x)", (BENCH / "fleet.txt").read_text()).group(1)
    step, cold_s = float(fleet[ms]) / 1000, float(cold[ms]) / 1000
    assert (f"took {step:.2f} s a step at steps 25-30 ({ratio} one agent alone, {cold_s:.1f} s with nothing cached), "
            f"the planted code in {fleet['reached']} prompts") in _text("README.md")
    docs = _text("docs/documents.md")
    assert (f"| 16 agents x 30 steps, interleaved round robin | {step:.2f} s ({ratio} alone) | {fleet['reached']} "
            f"steps | {fleet['cache MiB']} MiB, {fleet['documents']} documents, 0 evicted | "
            f"{float(fleet['peak RSS MiB']):,.0f} MiB |") in docs
    assert (f"| one agent alone (4 agents, one after another) | {float(alone[ms]) / 1000:.2f} s | {alone['reached']} | "
            f"{alone['cache MiB']} MiB | {float(alone['peak RSS MiB']):,.0f} MiB |") in docs
    assert f"| two agents, nothing cached (`--doc-cache-mb 0`) | {cold_s:.1f} s | {cold['reached']} |" in docs
    worst = {arm: rows[arm]["max step / cold's"] for arm in ("fleet", "alone")}
    assert (f"every fleet step cost at most {worst['fleet']}x and every step of an agent alone at most "
            f"{worst['alone']}x") in docs


def test_the_batch_figures_are_batch_jsonl_rows():
    rows = [json.loads(line) for line in (BENCH / "batch.jsonl").read_text().splitlines() if line.strip()]
    arm = {row["arm"]: row for row in rows if row["lines"] == 10000}
    speed = {name: f"{arm[name]['lines_per_s']:.2f}" for name in ("process", "serve", "redis-2")}
    scale = arm["redis-2"]["lines_per_s"] / arm["redis-1"]["lines_per_s"]
    cli = [arm[name]["peak_rss_mib"] for name in ("serve", "redis-1", "redis-2")]
    assert (f"(10,000 lines of ~700 tokens: {speed['process']} lines/s in process, {speed['serve']} through `ilre "
            f"serve`, {speed['redis-2']} through 2 workers on hosts of their own, {scale:.2f}x one; the CLI at "
            f"{min(cli):.0f}-{max(cli):.0f} MiB)") in _text("README.md")


def test_the_soak_figures_are_their_summaries():
    mixed = (BENCH / "soak-mixed" / "summary.md").read_text()
    requests = int(re.search(r"requests: (\d+)", mixed).group(1))
    lost = re.search(r"quiet lost: (\d+); wrong answers: (\d+)", mixed).groups()
    worker = re.search(r"steady worker: [^,]+, ([\d.]+%)", mixed).group(1)
    partitions = _table(BENCH / "soak-partitions" / "summary.md", "outcome")
    answered = int(partitions["ok"]["requests"])
    unread = sum(int(row["requests"]) for name, row in partitions.items() if name.startswith("results left unread"))
    bad = [name for name in partitions if name in ("lost", "wrong") or name.startswith("other")]
    readme = _text("README.md")
    assert lost == ("0", "0") and f"(0 of {requests:,} lost or wrong, worker RSS within {worker})" in readme
    assert unread == 0 and not bad and f"(0 of {answered:,} lost, wrong or duplicated:" in readme
    assert f"{answered:,} answers" in _text("docs/operations.md")


def test_a_32k_first_question_is_documents_at_once_row():
    row = next(r for length, r in _table(BENCH / "documents_at_once.txt", "context tokens").items()
               if 32768 <= int(length) < 33000)
    first, at_once = float(row["first s"]), float(row["at once by id s"].split()[0])
    later = float(row["60 s later by id s"].split()[0])
    assert (f"(bfloat16 here: 32K first {first:.1f} s, at once {at_once:.1f} s, later {later:.2f} s)"
            in _text("README.md"))


FLEET = BENCH / "fleet.jsonl"  # bench/fleet_bench.py's arms, as last measured
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def memory_limits() -> list[tuple[str, str, int]]:
    """(manifest, container, bytes) of every container memory limit in deploy/'s Kubernetes manifests."""
    found = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                limit = container.get("resources", {}).get("limits", {}).get("memory")
                if limit is not None:
                    number, unit = re.fullmatch(r"(\d+)([KMG]i)", limit).groups()
                    found.append((str(path.relative_to(ROOT / "deploy")), container["name"], int(number) * UNITS[unit]))
    return found


def test_the_manifests_memory_limits_hold_the_measured_peaks():
    """A figure the manifests carry: a worker's limit holds the peak RSS of the same engine with its default caches full, as the fleet bench
    measured it (`fill`: `ilre serve` with a worker's defaults, its 1 GiB document cache filled and evicting;
    `fleet`: 16 agents' histories through one sidecar), with a tenth to spare. The sidecar pod serves a 7B model on a
    GPU (its host memory is not this machine's to measure): its limit is the only other one, and is checked to exceed
    the embedded model's peak."""
    arms = {arm["arm"]: arm for arm in map(json.loads, FLEET.read_text().splitlines())}
    assert arms["fill"]["cache"]["evictions"] > 0  # the cache was full
    peak = max(arms[name]["cache"]["peak_rss_mib"] for name in ("fill", "fleet")) * 2**20
    limits = {(path, name): size for path, name, size in memory_limits()}
    assert set(limits) == {("k8s/worker.yaml", "worker"), ("sidecar/pod.yaml", "ilre")}, limits
    assert all(1.1 * peak <= size for size in limits.values()), (peak / 2**20, limits)
