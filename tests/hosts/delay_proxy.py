"""A TCP proxy that adds latency: each chunk read on one side is written to the other `delay` ms
later, order kept (a link's round trip grows by twice the delay). The delay is re-read from a control
file (milliseconds, as text) every 100 ms, so a test changes it while connections are open.

    python delay_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT CONTROL_FILE READY_FILE
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

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
        pass


async def main(listen: int, host: str, port: int, control: Path, ready: Path) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    asyncio.get_running_loop().create_task(follow(control))
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    ready.write_text("ready")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])))
