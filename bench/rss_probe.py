"""Run an `ilre` command and report its memory beyond the loaded model, on stderr as one JSON line.

    python bench/rss_probe.py compress --context-file doc.txt --query "..." --json

The peak-RSS counter (VmHWM) is reset when the Engine has loaded (Linux: `5 > /proc/self/clear_refs`),
so `peak_mib - loaded_mib` is what the request itself needed: the text, the IDs, the prefill's
working set and the layer-l_R key cache, not the weights or the start-up transients.
"""

from __future__ import annotations

import json
import sys


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024.0


def main() -> int:
    from ilre.cli.main import main as ilre
    from ilre.engine import engine as engine_module

    marks: dict[str, float] = {}
    load = engine_module.Engine.__init__

    def loaded(self, *args, **kwargs) -> None:
        load(self, *args, **kwargs)
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        marks["loaded_mib"] = _status_mib("VmRSS")

    engine_module.Engine.__init__ = loaded
    code = ilre(sys.argv[1:])
    print(json.dumps({"code": code, "peak_mib": _status_mib("VmHWM"), **marks}), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
