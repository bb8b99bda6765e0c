"""Hosts in network namespaces on one switch, and faults injected by link (test support).

Each host is a namespace `ilre-<pid>-<host>` with `lo` and an `eth0` on 10.231.0.0/24, cabled by a veth
pair to a bridge in a switch namespace of its own: the hosts reach each other and nothing else, and the
machine's own namespace gains no interface and no address. Processes are started inside a host
(`spawn`), and the test's own calls are made from inside one (`on`: a thread moved into the namespace,
whose sockets stay there).

Faults, by link (a pair of hosts) or by host:
  cut(a, b)        every packet between a and b dropped silently (nftables, as it arrives at either)
  loss(a, b, pct)  a random share of them (nft `numgen random`)
  delay(a, b, ms)  added latency on the connections a makes to b: `shape(a, b)` first sends them through a
                   transparent TCP proxy of the harness's own in a (this kernel has no netem qdisc)
  heal(a, b)       back to a clean link (no cut, loss or delay)
  freeze(h)/thaw(h) SIGSTOP / SIGCONT every process of host h (a paused VM)
Everything a Cluster makes is removed by `stop()` (also at interpreter exit, and by the next Cluster
for one whose process died).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

SUBNET = "10.231.0"
CLONE_NEWNET = 0x40000000
PROXY = Path(__file__).with_name("delay_proxy.py")
_libc = ctypes.CDLL(None, use_errno=True)


def missing_tools() -> str | None:
    """Why hosts cannot be made here (not root, no `ip` or `nft`), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (`make tools` installs nftables when root: deploy/test-tools.sh)"
    return None


def _sh(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in `ns` (thawed first), then delete it."""
    for pid in map(int, _sh("ip", "netns", "pids", ns, check=False).split()):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    _sh("ip", "netns", "delete", ns, check=False)


def sweep_stale() -> None:
    """Remove the namespaces of Clusters whose process is gone (a test run killed mid-way)."""
    for ns in _sh("ip", "netns", "list", check=False).split():
        owner = re.fullmatch(r"ilre-(\d+)-.+", ns)
        if owner and not Path(f"/proc/{owner.group(1)}").exists():
            _kill_namespace(ns)


class Cluster:
    """Named hosts on one switch; `address(host)` is its IPv4 address (see the module docstring)."""

    def __init__(self, hosts: Sequence[str]):
        if len(set(hosts)) != len(hosts) or not all(re.fullmatch(r"[a-z][a-z0-9]{0,11}", h) for h in hosts):
            raise ValueError(f"hosts: distinct names of 1-12 lowercase letters and digits, got {list(hosts)}")
        self.hosts = list(hosts)
        self.tag = f"ilre-{os.getpid()}-{id(self) % 10000}"
        self.work = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.procs: dict[str, list[subprocess.Popen]] = {h: [] for h in hosts}
        self._rules: dict[tuple[str, ...], str] = {}  # sorted (a, b) -> "cut" | loss percent as text
        self._delays: dict[tuple[str, str], Path] = {}
        self._threads: dict[str, ThreadPoolExecutor] = {}
        self._made: list[str] = []
        self._lock = threading.Lock()

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}" if host != "switch" else f"{self.tag}-sw"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts.index(host) + 2}"

    def start(self) -> "Cluster":
        sweep_stale()
        atexit.register(self.stop)
        switch = self.ns("switch")
        self._add_namespace(switch)
        _sh("ip", "-n", switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            ns = self.ns(host)
            self._add_namespace(ns)
            _sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"port{i}", "netns", switch)
            _sh("ip", "-n", switch, "link", "set", f"port{i}", "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def _add_namespace(self, ns: str) -> None:
        _sh("ip", "netns", "add", ns)
        self._made.append(ns)

    def __enter__(self) -> "Cluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Kill every process of every host, remove the namespaces and the work directory."""
        with self._lock:
            for pool in self._threads.values():
                pool.shutdown(wait=False, cancel_futures=True)
            self._threads.clear()
            for procs in self.procs.values():
                for proc in procs:
                    if proc.poll() is None:
                        for sig in (signal.SIGCONT, signal.SIGKILL):
                            proc.send_signal(sig)
                        proc.wait(10)
            for ns in reversed(self._made):
                _kill_namespace(ns)
            self._made.clear()
            shutil.rmtree(self.work, ignore_errors=True)
        atexit.unregister(self.stop)

    # -- processes and calls inside a host --------------------------------------------------------------

    def spawn(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Start `argv` inside `host` (its pid is the command's own: `ip netns exec` execs it)."""
        popen.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv], **popen)
        self.procs[host].append(proc)
        return proc

    def on(self, host: str, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """fn(*args) on a thread inside `host`'s namespace (its sockets are that host's)."""
        return self.pool(host).submit(fn, *args).result(timeout)

    def pool(self, host: str, workers: int = 8) -> ThreadPoolExecutor:
        """Threads inside `host` for the test's own calls (made once per host)."""
        if host not in self._threads:
            fd = os.open(f"/run/netns/{self.ns(host)}", os.O_RDONLY)

            def enter() -> None:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {host}")

            self._threads[host] = ThreadPoolExecutor(workers, thread_name_prefix=f"host-{host}", initializer=enter)
        return self._threads[host]

    # -- faults ------------------------------------------------------------------------------------------

    def cut(self, a: str, *others: str) -> None:
        """Drop every packet between a and each of `others` (all other hosts when none is named)."""
        self._set(a, others, "cut")

    def loss(self, a: str, b: str, percent: float) -> None:
        """Drop `percent` % of the packets between a and b, at random, each way."""
        if not 0 < percent < 100:
            raise ValueError(f"percent: between 0 and 100, got {percent}")
        self._set(a, (b,), f"{percent:g}")

    def heal(self, a: str, *others: str) -> None:
        """Clean links between a and `others` (all when none is named): no cut, loss or delay."""
        self._set(a, others, None)
        for b in others or self.hosts:
            if (a, b) in self._delays:
                self.delay(a, b, 0)

    def _set(self, a: str, others: Sequence[str], rule: str | None) -> None:
        touched = {a}
        for b in others or [h for h in self.hosts if h != a]:
            link = tuple(sorted((a, b)))
            if rule is None:
                self._rules.pop(link, None)
            else:
                self._rules[link] = rule
            touched.add(b)
        for host in touched:
            self._apply(host)

    def _apply(self, host: str) -> None:
        """Rewrite the drop rules of packets arriving at `host` in one nft transaction (dropped on the way
        in at both ends, so that senders see silence, not a local error)."""
        rules = []
        for link, rule in self._rules.items():
            if host in link:
                other = link[1] if link[0] == host else link[0]
                match = "" if rule == "cut" else f"numgen random mod 10000 < {int(float(rule) * 100)} "
                rules.append(f"    ip saddr {self.address(other)} {match}drop\n")
        body = ("table inet faults {}\ndelete table inet faults\ntable inet faults {\n"
                "  chain input {\n    type filter hook input priority 0;\n" + "".join(rules) + "  }\n}\n")
        _sh("ip", "netns", "exec", self.ns(host), "nft", "-f", "-", stdin=body)

    def shape(self, a: str, *others: str) -> None:
        """Send a's new TCP connections to `others` (all other hosts when none is named) through a transparent
        delay proxy in a, at no delay until `delay` sets one: call before a's processes connect."""
        proxy_port, mark = 15000, 0x1f
        ready = self.work / f"proxy-{a}"
        if not ready.exists():
            control = self.work / f"delay-{a}"
            control.write_text("0")
            self.spawn(a, [sys.executable, str(PROXY), str(proxy_port), str(mark), str(control), str(ready)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while not ready.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the delay proxy on {a} did not start")
                time.sleep(0.05)
        for b in others or [h for h in self.hosts if h != a]:
            self._delays[(a, b)] = self.work / f"delay-{a}"
        targets = ", ".join(self.address(b) for (x, b) in self._delays if x == a)
        body = (f"table ip shaping {{}}\ndelete table ip shaping\ntable ip shaping {{\n"
                f"  chain output {{\n    type nat hook output priority -100;\n"
                f"    meta mark != {mark} ip daddr {{ {targets} }} tcp dport != 22 redirect to :{proxy_port}\n  }}\n}}\n")
        _sh("ip", "netns", "exec", self.ns(a), "nft", "-f", "-", stdin=body)

    def delay(self, a: str, b: str, ms: float) -> None:
        """Hold every chunk on a's connections to shaped hosts `ms` longer, either way (see `shape`: one delay
        per host a, whichever shaped host b is named)."""
        if (a, b) not in self._delays:
            raise ValueError(f"delay: the links of {a} to {b} are not shaped (Cluster.shape)")
        path = self._delays[(a, b)]
        path.with_suffix(".tmp").write_text(f"{ms:g}")
        path.with_suffix(".tmp").replace(path)

    def freeze(self, host: str) -> None:
        """SIGSTOP every process of `host`."""
        self._signal(host, signal.SIGSTOP)

    def thaw(self, host: str) -> None:
        self._signal(host, signal.SIGCONT)

    def _signal(self, host: str, sig: int) -> None:
        for pid in map(int, _sh("ip", "netns", "pids", self.ns(host)).split()):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
