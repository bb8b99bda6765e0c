"""The document secret the workers of one Redis prefix agree on (engine/document_names.py).

Without a configured secret (ILRE_DOCUMENT_SECRET), the secret lives on Redis at
`{prefix}:document-secret`: each worker offers the one it holds (SET NX: the first worker's own
random one) and adopts whatever Redis holds, at start and on every heartbeat. So every worker names
documents alike, a restarted worker or front end keeps the names, a Redis that lost its data gets
the secret back from the workers, and an operator rotates it with one SET:

    redis-cli -u "$ILRE_REDIS_URL" SET ilre:document-secret "$(openssl rand -hex 32)"

Within one heartbeat every worker names documents under the new secret: every document_id issued
before is unknown (NOT_FOUND: send the context again), and the shared tier's old entries age out.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from ...contract.document_ids import MIN_SECRET_CHARS

if TYPE_CHECKING:
    from ...engine.engine import Engine

log = logging.getLogger(__name__)


async def agreed_secret(client: aioredis.Redis, key: str, offered: bytes) -> bytes:
    """The secret Redis holds at `key`, after offering `offered` where it holds none (SET NX)."""
    for _ in range(3):  # a DEL between the SET and the GET: offer again
        await client.set(key, offered, nx=True)
        held = await client.get(key)
        if held is not None:
            break
    else:
        return offered
    held = held if isinstance(held, bytes) else str(held).encode()
    if len(held) < MIN_SECRET_CHARS:
        log.error("document secret at %s is shorter than %d characters: ignored, keeping the one held",
                  key, MIN_SECRET_CHARS)
        return offered
    return held


async def sync_secret(client: aioredis.Redis, key: str, engine: "Engine", worker: str) -> None:
    """Have `engine` issue document ids under the secret Redis holds (a change is logged by fingerprint)."""
    before = engine.names.fingerprint()
    if engine.adopt_secret(await agreed_secret(client, key, engine.names.secret)):
        log.warning("worker %s: document secret %s from Redis (was %s here); document_ids issued under the old "
                    "one are unknown", worker, engine.names.fingerprint(), before)
