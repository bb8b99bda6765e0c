"""A worker-like flood in one process, to see glibc's heap under it: a minute-by-minute line of RSS, mallinfo2
(heap held over all arenas, mapped blocks, in use, free inside the heap), the document cache's counted bytes, live
tensor bytes and trims. Run by hand from the repository root (it starts a redis-server on port 6399 for the
shared tier):

    python bench/heap_flood.py MINUTES                          # the engine as it is
    MALLOC_MMAP_THRESHOLD_=1048576 python bench/heap_flood.py 5  # glibc settings from the environment

results/bench/heap-flood/ holds the runs behind engine/heap.py (the file names say what each ran with:
glibc-defaults.log before 8615cc8; off-heap.log with the cache off the heap; the mmap/trim thresholds set
from the environment, as tune_allocator now sets them).
"""
import ctypes, gc, os, sys, time, random, subprocess
sys.path.insert(0, "bench")
arena = int(os.environ.get("ARENA", "0"))
libc = ctypes.CDLL("libc.so.6")
if arena: libc.mallopt(-8, arena)
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = MI2
import torch
from concurrent.futures import ThreadPoolExecutor
from mixed_bench import SUITE, sample
from ilre.contract.messages import CompressRequest, ScopedRequest
from ilre.engine.engine import Engine, EngineConfig
from ilre.service.documents.redis_tier import RedisDocuments
port = 6399
srv = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
time.sleep(0.5)
shared = RedisDocuments(f"redis://127.0.0.1:{port}/0", "ilre", max_bytes=int(os.environ.get("SHARED_MB", "256")) << 20)
eng = Engine(EngineConfig(dtype="float32", deepen=True, doc_cache_mb=int(os.environ.get("CACHE_MB", "256"))), shared_documents=shared)
tok = eng.tokenizer
rng = random.Random(0)
quiet = [sample(tok, k, n, 7) for k, n in (("JSON lines", 2048), ("Python source", 4096), ("prose question", 8192))]
def rss():
    for l in open("/proc/self/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) >> 10
def live_tensor_mib():
    seen, tot = set(), 0
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor):
            try: s = o.untyped_storage()
            except Exception: continue
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr()); tot += s.nbytes()
    return tot >> 20
ex = ThreadPoolExecutor(1)
t0 = time.time(); n = 0; nextp = 0
minutes = float(sys.argv[1])
while time.time() - t0 < minutes * 60:
    if rng.random() < 0.3:
        c, q, _ = quiet[rng.randrange(3)]; scope = "key:quiet"
    else:
        c, q, _ = sample(tok, rng.choice(list(SUITE)), rng.choice((1024, 2048, 4096)), rng.randrange(1 << 30)); scope = "key:flood"
    ex.submit(eng.compress_many, [ScopedRequest(CompressRequest(context_ids=c, query_ids=q, budget=256), scope)]).result()
    n += 1
    if rng.random() < 0.3: time.sleep(2)  # idle moments: deepening runs
    if time.time() - t0 >= nextp:
        m = libc.mallinfo2()
        print(f"t={int(time.time()-t0)}s n={n} rss={rss()} arena={m.arena>>20} mmapped={m.hblkhd>>20} inuse={m.uordblks>>20} free={m.fordblks>>20} cache={eng.documents.stats.bytes>>20 if hasattr(eng.documents.stats,'bytes') else -1} tensors={live_tensor_mib()} trims={eng.heap.trims}", flush=True)
        nextp += 60
srv.terminate()
