"""The document cache: a context's token IDs and encoded prefill states, reused across queries.

A document is held under its slot (engine/document_names.py: a keyed digest of the caller's scope
and the document_id it was given); a request may later send that id instead of the context, and
finds it only from the same scope. Two tiers, both optional to a request and invisible in its result:
  in process  documents bounded in bytes (`--doc-cache-mb`): each document's IDs and its
              ContextStates, one per prefill setting (layer, S/W/chunk, DCA; the dtype and device
              are the process's own), held where the model runs. Each state holds only what a later
              query reads (ContextState.freeze), and the byte count is what the tensors hold.
              Eviction goes by owners' turns (below); within each, it drops first what is cheapest to
              recompute: the whole encoding a conversation's end keeps beside its keys (windows, resume
              point: encoded again from the IDs when asked), least recently used first. Then it keeps
              documents that are asked again: the states of
              documents named once (least recently used first), then those documents, then the states of documents
              named again, then those, so a burst of one-off documents cannot push out a small
              document that is asked every few seconds. Each document has an owner (the caller's
              scope, as an opaque tag): a caller holding more than its `share` of the cap gives up
              its own documents first, then owners over their share give up theirs, so one
              that stays within its share is never evicted by another's traffic (while no more than
              1/share owners hold documents; beyond that, the least recently used of anyone's go)
  shared      a `SharedDocuments` store (service/documents/redis_tier.py: Redis with a TTL and a byte
              cap) that every worker reads, so a second query reaches any worker; states travel
              as named tensors (ContextState.to_tensors)
A lookup tries the process first, then the shared store (and keeps what it found); every encode
is stored in both. The shared tier is best effort: when it fails, the request is computed.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import torch

from ..compressor.context_state import ContextState, STATE_PARTS
from ..compressor.units import Units
from ..contract.defaults import DOC_CACHE_SHARE
from .document_entries import CacheStats, HeldDocument, KEYS_ONLY, SharedDocuments, state_key
from .heap import off_heap

__all__ = ["KEYS_ONLY", "CacheStats", "DocumentCache", "SharedDocuments", "state_key"]


class DocumentCache:
    """The two tiers behind one interface; safe to call from several threads."""

    def __init__(self, max_bytes: int, shared: SharedDocuments | None = None, share: float = DOC_CACHE_SHARE):
        self.max_bytes, self.share = max_bytes, share
        self.shared = shared
        self.stats = CacheStats()
        self._docs: collections.OrderedDict[str, HeldDocument] = collections.OrderedDict()
        self._prefixes: dict[str, str] = {}  # prefix slot -> the slot of the document whose encoding it takes on
        # Kept as documents change, so that eviction reads only what it may evict (not every document held):
        self._stateful: collections.OrderedDict[str, None] = collections.OrderedDict()  # slots with states, LRU order
        self._counted: dict[str, int] = {}  # slot -> its document's bytes, counted at its last change
        self._used: collections.Counter = collections.Counter()  # owner -> bytes its documents hold
        self._lock = threading.RLock()

    def ids(self, slot: str, owner: str = "") -> torch.Tensor | None:
        """(L,) int64 IDs of the document held in `slot`, or None (evicted everywhere, or never there); one found
        on the shared tier is kept here in `owner`'s share."""
        with self._lock:
            entry = self._docs.get(slot)
            if entry is not None:
                self._touch(slot)
                entry.uses += 1
                self.stats.hits["ids", "local"] += 1
                return entry.ids
        self.stats.misses["ids", "local"] += 1
        if self.shared is None:
            return None
        ids = self.shared.get_ids(slot)
        (self.stats.hits if ids is not None else self.stats.misses)["ids", "shared"] += 1
        if ids is not None:
            self._insert(slot, HeldDocument(ids, uses=2, owner=owner))  # named again: another worker saw it first
        return ids

    def held_ids(self, slot: str) -> torch.Tensor | None:
        """(L,) IDs this process holds in `slot`, or None; a look only (no use counted, no shared tier asked)."""
        with self._lock:
            entry = self._docs.get(slot)
            return None if entry is None else entry.ids

    def remember(self, slot: str, ids: torch.Tensor, owner: str = "") -> None:
        """Record a document's IDs in `slot` (in both tiers, in `owner`'s share) so that later requests may name it
        by id."""
        with self._lock:
            if slot in self._docs:
                self._touch(slot)
                self._docs[slot].uses += 1
                return
        self._insert(slot, HeldDocument(off_heap(ids), owner=owner))
        if self.shared is not None:
            self.shared.put_ids(slot, ids, owner)

    def state(self, slot: str, key: str, encode: Callable[[], ContextState],
              restore: Callable[[dict[str, torch.Tensor]], ContextState], owner: str = "") -> ContextState:
        """The document's ContextState for prefill settings `key`: from this process, else from the
        shared store (`restore` places its tensors), else `encode()`d and stored in both (in `owner`'s share)."""
        return self._tiered(slot, key, "state", lambda entry: entry.states, encode, restore, ContextState.to_tensors,
                            owner)

    def units(self, slot: str, key: str, compute: Callable[[], Units], owner: str = "") -> Units:
        """The document's Units for segmentation setting `key`: from this process, else the shared store
        (under the state key `key`, as the tensors "bounds" and "heads"), else `compute()`d and stored in
        both. Kept with the document's IDs (a few bytes per unit), evicted with the document."""
        return self._tiered(slot, key, "units", lambda entry: entry.units, compute, Units.from_tensors, Units.to_tensors,
                            owner)

    def held_state(self, slot: str, key: str,
                   restore: Callable[[dict[str, torch.Tensor]], ContextState]) -> ContextState | None:
        """The document's ContextState for `key` if either tier holds it (nothing is encoded)."""
        return self._lookup(slot, key, "state", lambda entry: entry.states, restore)

    def store_state(self, slot: str, key: str, state: ContextState, replaces: str | None = None,
                    owner: str = "", shared: bool = True) -> bool:
        """Keep a state encoded elsewhere (a background deepening) under `key`, in both tiers (in `owner`'s
        share; `shared` False: in this process only), dropping this process's state `replaces`, which it
        supersedes. False when the document has left this process (nothing is kept then)."""
        with self._lock:
            entry = self._docs.get(slot)
            if entry is None:
                return False
            if replaces is not None:
                entry.states.pop(replaces, None)
                entry.changed()
        if self.shared is not None and shared:
            self.shared.put_state(slot, key, state.to_tensors(), owner)
        return self._keep(slot, key, lambda entry: entry.states, state)

    def drop_state(self, slot: str, key: str, shared: bool = False) -> None:
        """Forget this process's state `key` of the document in `slot` (`shared`: the shared tier's too, else it
        keeps what it holds)."""
        if shared and self.shared is not None:
            self.shared.drop_state(slot, key)
        with self._lock:
            entry = self._docs.get(slot)
            if entry is not None and entry.states.pop(key, None) is not None:
                entry.changed()
                self._fit(keep=slot)

    def refit(self, slot: str) -> None:
        """Evict to the cap again after the document in `slot` grew in place (a state's candidate rows,
        compressor/candidate_rows.py), as if it had just been stored."""
        with self._lock:
            if slot in self._docs:
                self._docs[slot].changed()
                self._fit(keep=slot)

    def name_prefix(self, prefix: str, slot: str) -> None:
        """Record that the document in `slot` can be taken on by a longer context whose first tokens have the slot
        `prefix` (its states' resume point: `ContextState.resume`), in both tiers."""
        with self._lock:
            entry = self._docs.get(slot)
            if entry is None:
                return
            entry.prefixes.add(prefix)
            self._prefixes[prefix] = slot
        if self.shared is not None:
            self.shared.put_prefix(prefix, slot)

    def resumable(self, prefixes: list[tuple[int, str]], key: str,
                  restore: Callable[[dict[str, torch.Tensor]], ContextState]) -> ContextState | None:
        """The longest encoding under `key` that a context can take on: prefixes [(at, prefix slot)], longest
        first, are the context's chunk boundaries and the slots its first `at` tokens would have as a document;
        the first one some held document's state resumes at (`ContextState.resume.at == at`) is returned, from
        this process, else from the shared store (restored, not kept: it is another document's). None: none.
        A prefix slot is a keyed digest of the caller's scope and the exact IDs, so only the caller's own
        documents answer, and only for the same tokens."""
        with self._lock:
            for at, prefix in prefixes:
                entry = self._docs.get(self._prefixes.get(prefix, ""))
                state = entry.states.get(key) if entry is not None else None
                if state is not None and state.resume is not None and state.resume.at == at:
                    self._touch(self._prefixes[prefix])
                    self.stats.hits["prefix", "local"] += 1
                    return state
        self.stats.misses["prefix", "local"] += 1
        if self.shared is None or not prefixes:
            return None
        for (at, _), slot in zip(prefixes, self.shared.get_prefixes([p for _, p in prefixes])):
            tensors = self.shared.get_state(slot, key) if slot is not None else None
            if tensors is not None:
                state = restore(tensors)
                if state.resume is not None and state.resume.at == at:
                    self.stats.hits["prefix", "shared"] += 1
                    return state
        self.stats.misses["prefix", "shared"] += 1
        return None

    def part_bytes(self) -> dict[str, int]:
        """The bytes this process holds, by part (ids, units, and STATE_PARTS: keys, windows, stream, ...): what each
        document's entries hold (`/metrics`: ilre_doc_cache_part_bytes)."""
        total: collections.Counter = collections.Counter({part: 0 for part in ("ids", "units", *STATE_PARTS)})
        with self._lock:
            for entry in self._docs.values():
                total.update(entry.part_bytes())
        return dict(total)

    def holds(self, slot: str, key: str | None = None) -> bool:
        """Whether this process holds the document in `slot` (with `key`: and its state under that key);
        touches nothing."""
        with self._lock:
            entry = self._docs.get(slot)
            return entry is not None and (key is None or key in entry.states)

    def _tiered(self, slot: str, key: str, kind: str, held: Callable[[HeldDocument], dict], compute: Callable[[], Any],
                restore: Callable[[dict[str, torch.Tensor]], Any], to_tensors: Callable[[Any], dict[str, torch.Tensor]],
                owner: str):
        """What `held(entry)[key]` holds for the document: from this process, else the shared store
        (`restore`d from its tensors), else `compute()`d and stored in both (counted as `kind`)."""
        found = self._lookup(slot, key, kind, held, restore)
        if found is not None:
            return found
        value = compute()
        if self.shared is not None:
            self.shared.put_state(slot, key, to_tensors(value), owner)
        self._keep(slot, key, held, value)
        return value

    def _lookup(self, slot: str, key: str, kind: str, held: Callable[[HeldDocument], dict],
                restore: Callable[[dict[str, torch.Tensor]], Any]) -> Any:
        """`held(entry)[key]` from this process, else from the shared store (restored and kept here), else None."""
        with self._lock:
            entry = self._docs.get(slot)
            found = held(entry).get(key) if entry is not None else None
            if found is not None:
                self._touch(slot)
                self.stats.hits[kind, "local"] += 1
                return found
        self.stats.misses[kind, "local"] += 1
        if self.shared is None:
            return None
        tensors = self.shared.get_state(slot, key)
        (self.stats.hits if tensors is not None else self.stats.misses)[kind, "shared"] += 1
        if tensors is None:
            return None
        value = restore(tensors)
        self._keep(slot, key, held, value)
        return value

    def _keep(self, slot: str, key: str, held: Callable[[HeldDocument], dict], value: Any) -> bool:
        """Hang `value` on the document under `key` (a state's tensors moved off the heap first) and evict to the
        cap; False when the document is not held (evicted meanwhile, or its IDs never fit)."""
        if isinstance(value, ContextState) and self.holds(slot):
            value.map_tensors(off_heap)
        with self._lock:
            entry = self._docs.get(slot)
            if entry is None:
                return False
            held(entry)[key] = value
            entry.changed()
            self._touch(slot)
            self._fit(keep=slot)
            return True

    def _forget(self, entry: HeldDocument) -> None:
        """Drop the prefix slots naming an evicted document."""
        for prefix in entry.prefixes:
            self._prefixes.pop(prefix, None)

    def clear(self) -> None:
        """Forget every document this process holds (the shared tier is left as it is)."""
        with self._lock:
            self._docs.clear()
            self._prefixes.clear()
            self._stateful.clear()
            self._counted.clear()
            self._used.clear()
            self.stats.bytes = self.stats.documents = 0

    def _insert(self, slot: str, entry: HeldDocument) -> None:
        with self._lock:
            if (old := self._docs.get(slot)) is not None:  # another thread brought it meanwhile: this one replaces it
                self._account(old.owner, -self._counted.pop(slot, 0))
                self._stateful.pop(slot, None)
            self._docs[slot] = entry
            self._touch(slot)
            self._fit(keep=slot)

    def _touch(self, slot: str) -> None:
        """The document in `slot` was just used: it goes last in the eviction order."""
        self._docs.move_to_end(slot)
        if slot in self._stateful:
            self._stateful.move_to_end(slot)

    def _account(self, owner: str, delta: int) -> None:
        self._used[owner] += delta
        if self._used[owner] <= 0:
            del self._used[owner]

    def _recount(self, slot: str) -> None:
        """Count the bytes of the document in `slot` again after a change (its owner's total and whether it holds
        states follow). Every change to a held document ends here: `_fit` recounts the document it keeps, and
        eviction the ones it changes."""
        entry = self._docs[slot]
        bytes_now = entry.nbytes
        self._account(entry.owner, bytes_now - self._counted.get(slot, 0))
        self._counted[slot] = bytes_now
        if not entry.states:
            self._stateful.pop(slot, None)
        elif slot not in self._stateful:  # its first state: it was just used (`_keep`), so it goes last
            self._stateful[slot] = None

    def _fit(self, keep: str) -> None:
        """Evict until the cap holds. Who gives up entries, in turn: the owner of `keep` (the document just used)
        while it holds more than its share, owners over their share, the states of `keep` itself while its owner
        is still over its share, then (shares oversubscribed) anyone; within
        each turn least recently used first, in the order: the states of documents named once, those documents,
        the states of documents named again, those documents. `keep` goes last: first its states, then, if its
        IDs alone do not fit, the document itself."""
        if keep in self._docs:
            self._recount(keep)
        used = self._used
        total, share = sum(used.values()), self.share * self.max_bytes
        owner = self._docs[keep].owner if keep in self._docs else None
        turns = (lambda who: who == owner and used[who] > share, lambda who: used[who] > share, None, lambda who: True)
        for turn in turns:
            if turn is None:  # the writer over its share gives up the states it just brought before anyone else's
                if total > self.max_bytes and keep in self._docs and used[owner] > share and self._docs[keep].states:
                    total -= self._evict(keep, False, owner)
                continue
            # within each turn first what is cheapest to recompute: a message's whole encoding beside its keys
            for slot in (list(self._stateful) if total > self.max_bytes else ()):
                if total <= self.max_bytes:
                    break
                if turn(self._docs[slot].owner):
                    total -= self._drop_spare(slot, owner)
            for repeated, whole in ((False, False), (False, True), (True, False), (True, True)):
                # the states passes read only documents holding states; a list is made only for a pass that runs
                for slot in (list(self._docs if whole else self._stateful) if total > self.max_bytes else ()):
                    if total <= self.max_bytes:
                        break
                    entry = self._docs[slot]
                    if (slot == keep or (entry.uses > 1) != repeated or not (whole or entry.states)
                            or not turn(entry.owner)):
                        continue
                    total -= self._evict(slot, whole, owner)
        entry = self._docs.get(keep)
        if total > self.max_bytes and entry is not None:
            total -= self._evict(keep, False, owner)
            if entry.nbytes > self.max_bytes:
                total -= self._evict(keep, True, owner)
        self.stats.bytes = max(0, total)
        self.stats.documents = len(self._docs)

    def _drop_spare(self, slot: str, by: str | None) -> int:
        """Drop the states of the document in `slot` that its keys-only twin can stand for (the whole encoding a
        conversation's end keeps: its windows and resume point, encoded again from the IDs where a request needs
        them), to make room for owner `by`; the bytes freed."""
        entry = self._docs[slot]
        spare = [key for key in entry.states if key + KEYS_ONLY in entry.states]
        if not spare:
            return 0
        before = self._counted.get(slot, 0)
        for key in spare:
            del entry.states[key]
        entry.changed()
        self._recount(slot)
        self._count(entry.owner, by, len(spare))
        return before - self._counted[slot]

    def _evict(self, slot: str, whole: bool, by: str | None) -> int:
        """Drop the document in `slot` (whole) or its states, to make room for owner `by`; the bytes freed (its
        owner's total and the stats follow)."""
        entry = self._docs[slot]
        before = self._counted.get(slot, 0)
        if whole:
            self._forget(self._docs.pop(slot))
            self._stateful.pop(slot, None)
            self._account(entry.owner, -self._counted.pop(slot, 0))
            count = 1
            self.stats.documents_evicted["own" if entry.owner == by else "pressure"] += 1
        else:
            count = len(entry.states)
            entry.states.clear()
            entry.changed()
            self._recount(slot)
        self._count(entry.owner, by, count)
        return before - self._counted.get(slot, 0)

    def _count(self, of: str, by: str | None, count: int) -> None:
        """`count` entries of owner `of` evicted for owner `by`: its own (own), or another's pressure (by whom)."""
        self.stats.evictions += count
        self.stats.evicted["own" if of == by else "pressure"] += count
        if of != by:
            self.stats.pressure[(by or "", of)] += count
