"""A transparent TCP proxy that adds latency, run inside a host: nftables redirects the host's new TCP
connections to the shaped hosts here (Cluster.shape); each is connected on to its original destination
(SO_ORIGINAL_DST, marked so that it is not redirected again), and each chunk read on one side is written to
the other `delay` ms later, order kept (a round trip grows by twice the delay). The delay is re-read from a
control file (milliseconds, as text) every 100 ms, so a test changes it while connections are open.

    python delay_proxy.py LISTEN_PORT MARK CONTROL_FILE READY_FILE
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from pathlib import Path

SO_ORIGINAL_DST = 80
DELAY_MS = [0.0]


async def follow(control: Path) -> None:
    while True:
        try:
            DELAY_MS[0] = float(control.read_text() or 0)
        except (OSError, ValueError):
            pass
        await asyncio.sleep(0.1)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy reader to writer, each chunk held until it is DELAY_MS old."""
    chunks: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while (item := await chunks.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(65536):
            chunks.put_nowait((time.monotonic() + DELAY_MS[0] / 1000.0, data))
    except (ConnectionError, OSError):
        pass
    chunks.put_nowait(None)
    try:
        await sender
    except (ConnectionError, OSError):
        writer.transport.abort()


async def main(listen: int, mark: int, control: Path, ready: Path) -> None:
    loop = asyncio.get_running_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket").getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, address = struct.unpack("!2xH4s8x", raw)
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        upstream.setblocking(False)
        try:
            await loop.sock_connect(upstream, (socket.inet_ntoa(address), port))
            upstream_reader, upstream_writer = await asyncio.open_connection(sock=upstream)
        except OSError:
            upstream.close()
            writer.transport.abort()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    loop.create_task(follow(control))
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    ready.write_text("ready")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
