// The CPU emulator's scheduler: a CTA's threads are fibers on one OS thread, the
// CTAs of a cluster run on OS threads of their own (so thread_local arrays serve as
// shared memory), and clusters are shared out over a few worker groups.
//
// A fiber runs until it reaches a block barrier, a cluster barrier wait or a warp
// collective. Once every fiber of the CTA waits, the scheduler resolves the warp
// collectives (lanes of one warp at one call site form a group), else releases the
// block barrier, else waits for the cluster barrier's phase. Fibers run in a fresh
// seeded random order each round, so a missing barrier shows up as a wrong result
// rather than hiding behind a fixed order. Anything that would hang or be undefined
// on a GPU (a full-warp shuffle with lanes missing, threads at different barriers,
// a cluster barrier some threads never reach) ends the launch with an error.
#include "emu.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nsa/emu/runtime.h"

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack and its pointer in *from,
// then resumes the stack `to` (System V x86-64).
extern "C" void nsa_emu_switch(void** from, void* to);
asm(R"(
.text
.globl nsa_emu_switch
.type nsa_emu_switch,@function
nsa_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size nsa_emu_switch, .-nsa_emu_switch
)");
#else
#error "the CPU emulator's fiber switch is written for x86-64"
#endif

namespace nsa_emu {
namespace {

constexpr size_t kStackBytes = 128 * 1024;
// Written at the bottom of each fiber's stack and checked after the CTA: an
// overflow is reported. (A guard page per fiber would cost two memory mappings a
// fiber, and thousands of fibers run at once: past vm.max_map_count.)
constexpr uint64_t kStackCanary = 0x6e73615f73746b21ull;
constexpr size_t kCanaryWords = 64;

enum class State : uint8_t { Ready, Warp, Block, ClusterWait, Done };

struct Fiber {
  void* sp = nullptr;
  uint32_t tid = 0;
  State state = State::Ready;
  // The pending warp collective.
  const char* file = nullptr;
  int line = 0, column = 0;
  Resolver resolve = nullptr;
  uint64_t in = 0, arg = 0, out = 0;
  uint64_t required = 0;
  const char* what = nullptr;
  // The cluster barrier phase this thread arrived in (waits until it completes),
  // and whether it has arrived without waiting yet.
  uint64_t arrived_phase = 0;
  bool arrived = false;
  // Asynchronous copies issued and not yet waited for: destination and word.
  std::vector<std::pair<uint32_t*, uint32_t>> copies;
};

// One cluster instance, shared by its CTAs' OS threads.
struct ClusterState {
  std::mutex m;
  std::condition_variable cv;
  uint32_t size = 1;
  uint64_t threads = 0;  // every thread of every CTA
  unsigned char* smem[32] = {};
  uint32_t registered = 0;
  uint64_t arrived = 0;  // arrivals in the current phase
  uint64_t phase = 0;    // completed phases
  // Per CTA: the phase all its live threads wait to complete (-1: none), and
  // whether it has finished.
  int64_t waits_for[32];
  bool finished[32] = {};
  bool failed = false;

  ClusterState() { std::fill(std::begin(waits_for), std::end(waits_for), -1); }

  // Every CTA finished or waiting for a phase that has not completed: no thread is
  // left to arrive.
  bool dead() const {
    for (uint32_t r = 0; r < size; ++r)
      if (!finished[r] && (waits_for[r] < 0 || (uint64_t)waits_for[r] < phase)) return false;
    return true;
  }
};

struct Launch {
  LaunchSpec spec;
  std::vector<std::unique_ptr<ClusterState>> clusters;
  std::atomic<bool> failed{false};
  std::mutex error_m;
  std::string error;

  void set_error(const std::string& e) {
    std::lock_guard<std::mutex> g(error_m);
    if (error.empty()) error = e;
    failed = true;
  }
};

// The fibers of one OS thread (reused for every CTA that thread runs).
struct Cta {
  Launch* launch = nullptr;
  ClusterState* cluster = nullptr;
  uint32_t block = 0, rank = 0;
  unsigned char* smem = nullptr;
  std::vector<Fiber> fibers;
  std::vector<uint32_t> order;
  unsigned char* stacks = nullptr;
  size_t stacks_bytes = 0;
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  uint64_t rng = 0;
  bool aborted = false;

  ~Cta() {
    if (stacks != nullptr) munmap(stacks, stacks_bytes);
  }
};

thread_local Cta* t_cta = nullptr;

void yield_to_scheduler() {
  Cta* c = t_cta;
  nsa_emu_switch(&c->cur->sp, c->sched_sp);
}

[[noreturn]] void fiber_start() {
  Cta* c = t_cta;
  c->launch->spec.entry(c->launch->spec.args);
  c = t_cta;
  if (!c->cur->copies.empty()) fail("a thread ended with async copies it never waited for", __FILE__, __LINE__);
  c->cur->state = State::Done;
  yield_to_scheduler();
  __builtin_unreachable();
}

uint64_t next_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

std::string lane_mask(uint64_t mask, uint32_t width) {
  char buf[24];
  if (width == 64) {
    std::snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)mask);
  } else {
    std::snprintf(buf, sizeof buf, "0x%08llx", (unsigned long long)mask);
  }
  return buf;
}

bool same_site(const Fiber& a, const Fiber& b) {
  return a.line == b.line && a.column == b.column && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

std::string site_of(const Fiber& f) {
  return std::string(f.what) + " at " + f.file + ":" + std::to_string(f.line) + ":" + std::to_string(f.column);
}

// Ends this CTA's run with an error shared with the whole launch and its cluster.
void abort_cta(Cta& c, const std::string& e) {
  c.launch->set_error("block " + std::to_string(c.block) + ": " + e);
  c.aborted = true;
  std::lock_guard<std::mutex> g(c.cluster->m);
  c.cluster->failed = true;
  c.cluster->cv.notify_all();
}

void prepare_stacks(Cta& c, uint32_t threads) {
  const size_t need = (size_t)threads * kStackBytes;
  if (c.stacks_bytes < need) {
    if (c.stacks != nullptr) munmap(c.stacks, c.stacks_bytes);
    void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("nsa_emu: mmap of fiber stacks");
      std::abort();
    }
    c.stacks = static_cast<unsigned char*>(p);
    c.stacks_bytes = need;
  }
  c.fibers.assign(threads, Fiber{});
  c.order.resize(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    Fiber& f = c.fibers[t];
    f.tid = t;
    c.order[t] = t;
    std::fill_n(reinterpret_cast<uint64_t*>(c.stacks + (size_t)t * kStackBytes), kCanaryWords, kStackCanary);
    auto* sp = reinterpret_cast<uint64_t*>(c.stacks + (size_t)(t + 1) * kStackBytes);
    *--sp = 0;  // fiber_start's return address: it never returns
    *--sp = reinterpret_cast<uint64_t>(&fiber_start);
    for (int r = 0; r < 6; ++r) *--sp = 0;  // rbp rbx r12-r15
    f.sp = sp;
  }
}

// Resolves every warp collective whose required lanes have all arrived at its call
// site; true if any was. A full-warp shuffle waits for lanes still at other sites
// (as on a GPU, where they reconverge there); `stuck` describes one that cannot
// complete yet, for the error when nothing else can move either.
bool resolve_warps(Cta& c, std::string& stuck) {
  bool any = false;
  stuck.clear();
  const uint32_t threads = (uint32_t)c.fibers.size();
  const uint32_t width = c.launch->spec.warp_size;
  for (uint32_t w0 = 0; w0 < threads; w0 += width) {
    Fiber* lanes = &c.fibers[w0];
    uint64_t pending = 0;
    for (uint32_t l = 0; l < width; ++l)
      if (lanes[l].state == State::Warp) pending |= 1ull << l;
    while (pending != 0u) {
      const Fiber& first = lanes[__builtin_ctzll(pending)];
      WarpGroup g{};
      g.lanes = width;
      for (uint32_t l = 0; l < width; ++l) {
        if ((pending >> l & 1u) && same_site(lanes[l], first)) {
          g.present |= 1ull << l;
          g.in[l] = lanes[l].in;
          g.arg[l] = lanes[l].arg;
        }
      }
      pending &= ~g.present;
      if ((first.required & ~g.present) != 0u) {
        if (stuck.empty()) {
          stuck = site_of(first) + ": warp " + std::to_string(w0 / width) + " needs lanes " +
                  lane_mask(first.required, width) + ", only " + lane_mask(g.present, width) + " arrived";
        }
        continue;
      }
      first.resolve(g);
      for (uint32_t l = 0; l < width; ++l) {
        if (g.present >> l & 1u) {
          lanes[l].out = g.out[l];
          lanes[l].state = State::Ready;
        }
      }
      any = true;
    }
  }
  return any;
}

// Every live thread of the CTA waits on the cluster barrier: blocks this OS thread
// until the phase they arrived in completes; false if it never can.
bool wait_cluster(Cta& c) {
  ClusterState& cl = *c.cluster;
  uint64_t need = UINT64_MAX;
  for (const Fiber& f : c.fibers)
    if (f.state == State::ClusterWait) need = std::min(need, f.arrived_phase);
  std::unique_lock<std::mutex> g(cl.m);
  cl.waits_for[c.rank] = (int64_t)need;
  cl.cv.notify_all();
  while (cl.phase <= need && !cl.failed) {
    if (cl.dead()) {
      const uint64_t missing = cl.threads - cl.arrived;
      g.unlock();
      abort_cta(c, "cluster barrier: " + std::to_string(missing) +
                       " threads of the cluster exited or wait elsewhere without arriving");
      g.lock();
      break;
    }
    cl.cv.wait(g);
  }
  cl.waits_for[c.rank] = -1;
  if (cl.failed) return false;
  for (Fiber& f : c.fibers)
    if (f.state == State::ClusterWait && f.arrived_phase < cl.phase) f.state = State::Ready;
  return true;
}

// Readies the threads waiting on a cluster barrier phase that has completed (the
// last arrival completes it without waiting); true if any were.
bool release_cluster_waiters(Cta& c) {
  bool any = false;
  std::lock_guard<std::mutex> g(c.cluster->m);
  for (Fiber& f : c.fibers) {
    if (f.state == State::ClusterWait && f.arrived_phase < c.cluster->phase) {
      f.state = State::Ready;
      any = true;
    }
  }
  return any;
}

// A fiber that ran past its stack has overwritten the canary below it.
bool stacks_intact(const Cta& c) {
  for (size_t t = 0; t < c.fibers.size(); ++t) {
    const auto* w = reinterpret_cast<const uint64_t*>(c.stacks + t * kStackBytes);
    if (std::any_of(w, w + kCanaryWords, [](uint64_t v) { return v != kStackCanary; })) return false;
  }
  return true;
}

void finish_cta(Cta& c) {
  std::lock_guard<std::mutex> g(c.cluster->m);
  c.cluster->finished[c.rank] = true;
  c.cluster->cv.notify_all();
}

void run_cta(Cta& c) {
  const LaunchSpec& s = c.launch->spec;
  prepare_stacks(c, s.block_threads);
  c.rng = (s.seed ^ (0x9e3779b97f4a7c15ull * (c.block + 1))) | 1u;
  c.aborted = false;
  for (;;) {
    for (uint32_t i = (uint32_t)c.order.size(); i > 1; --i) std::swap(c.order[i - 1], c.order[next_random(c.rng) % i]);
    for (uint32_t t : c.order) {
      Fiber& f = c.fibers[t];
      if (f.state != State::Ready) continue;
      c.cur = &f;
      nsa_emu_switch(&c.sched_sp, f.sp);
      if (c.aborted || c.launch->failed) {
        finish_cta(c);
        return;
      }
    }
    std::string stuck;
    if (resolve_warps(c, stuck)) continue;
    if (release_cluster_waiters(c)) continue;
    if (!stuck.empty()) {
      abort_cta(c, stuck);
      break;
    }
    uint32_t done = 0, block = 0, cluster = 0;
    for (const Fiber& f : c.fibers) {
      done += f.state == State::Done;
      block += f.state == State::Block;
      cluster += f.state == State::ClusterWait;
    }
    if (done == c.fibers.size()) break;
    if (block != 0 && block + done == c.fibers.size()) {
      for (Fiber& f : c.fibers)
        if (f.state == State::Block) f.state = State::Ready;
      continue;
    }
    if (cluster != 0 && cluster + done == c.fibers.size()) {
      if (!wait_cluster(c)) break;
      continue;
    }
    abort_cta(c, std::to_string(block) + " threads wait at a block barrier while " + std::to_string(cluster) +
                     " wait at a cluster barrier");
    break;
  }
  if (!c.aborted && !stacks_intact(c)) {
    abort_cta(c, "a thread overran its " + std::to_string(kStackBytes / 1024) + " KiB emulated stack");
  }
  finish_cta(c);
}

// Worker (group, rank): runs CTA `rank` of clusters group, group + groups, ...
void worker(Launch& L, uint32_t group, uint32_t groups, uint32_t rank) {
  Cta c;
  c.launch = &L;
  c.rank = rank;
  c.smem = L.spec.smem();
  t_cta = &c;
  const uint32_t clusters = L.spec.grid / L.spec.cluster;
  // Every worker of a group goes through the same clusters, also after a failure,
  // so none waits for a peer that has stopped.
  for (uint32_t i = group; i < clusters; i += groups) {
    ClusterState& cl = *L.clusters[i];
    // Garbage, as on a GPU (nothing may assume zeros), before any CTA of the cluster
    // starts.
    std::memset(c.smem, 0xa5, L.spec.smem_bytes);
    {
      std::unique_lock<std::mutex> g(cl.m);
      cl.smem[rank] = c.smem;
      ++cl.registered;
      cl.cv.notify_all();
      // No CTA starts before every CTA's shared memory is known (a DSMEM access
      // may come first).
      cl.cv.wait(g, [&] { return cl.registered == cl.size; });
    }
    c.cluster = &cl;
    c.block = i * L.spec.cluster + rank;
    if (L.failed) {
      finish_cta(c);
    } else {
      run_cta(c);
    }
  }
  t_cta = nullptr;
}

}  // namespace

uint32_t thread_x() { return t_cta->cur->tid; }
uint32_t block_x() { return t_cta->block; }
uint32_t cluster_rank() { return t_cta->rank; }
uint32_t cluster_size() { return t_cta->launch->spec.cluster; }

void sync_block() {
  t_cta->cur->state = State::Block;
  yield_to_scheduler();
}

void cluster_arrive() {
  Cta& c = *t_cta;
  if (c.cur->arrived) fail("barrier.cluster.arrive twice without a wait between", __FILE__, __LINE__);
  c.cur->arrived = true;
  ClusterState& cl = *c.cluster;
  std::lock_guard<std::mutex> g(cl.m);
  c.cur->arrived_phase = cl.phase;
  if (++cl.arrived == cl.threads) {
    cl.arrived = 0;
    ++cl.phase;
    cl.cv.notify_all();
  }
}

void cluster_wait() {
  Cta& c = *t_cta;
  if (!c.cur->arrived) fail("barrier.cluster.wait without an arrive before it", __FILE__, __LINE__);
  c.cur->arrived = false;
  {
    std::lock_guard<std::mutex> g(c.cluster->m);
    if (c.cluster->phase > c.cur->arrived_phase) return;
  }
  c.cur->state = State::ClusterWait;
  yield_to_scheduler();
}

unsigned char* cluster_smem(uint32_t rank, bool access) {
  Cta& c = *t_cta;
  ClusterState& cl = *c.cluster;
  const char* wrong = nullptr;
  {
    std::lock_guard<std::mutex> g(cl.m);
    // As on a GPU: a CTA's shared memory exists for the others from the cluster's
    // first barrier until it exits.
    if (rank >= cl.size) {
      wrong = "DSMEM access to a CTA rank outside the cluster";
    } else if (access && cl.phase == 0) {
      wrong = "DSMEM access before the cluster's first barrier (the other CTA may not have started)";
    } else if (access && cl.finished[rank]) {
      wrong = "DSMEM access to a CTA that has exited";
    }
  }
  if (wrong != nullptr) fail(wrong, __FILE__, __LINE__);
  return cl.smem[rank];
}

unsigned char* local_smem() { return t_cta->smem; }

bool in_local_smem(const void* p) {
  const Cta& c = *t_cta;
  const auto* b = static_cast<const unsigned char*>(p);
  return b >= c.smem && b < c.smem + c.launch->spec.smem_bytes;
}

uint64_t warp_collective(Resolver resolve, uint64_t in, uint64_t arg, uint64_t required, const char* what,
                         const char* file, int line, int column) {
  Fiber& f = *t_cta->cur;
  f.resolve = resolve;
  f.in = in;
  f.arg = arg;
  f.required = required;
  f.what = what;
  f.file = file;
  f.line = line;
  f.column = column;
  f.state = State::Warp;
  yield_to_scheduler();
  return f.out;
}

void async_copy(uint32_t* dst, uint32_t value) { t_cta->cur->copies.emplace_back(dst, value); }

void async_wait() {
  auto& copies = t_cta->cur->copies;
  for (const auto& [dst, value] : copies) *dst = value;
  copies.clear();
}

void fail(const char* what, const char* file, int line) {
  Cta& c = *t_cta;
  abort_cta(c, std::string(what) + " at " + file + ":" + std::to_string(line));
  c.cur->state = State::Done;
  yield_to_scheduler();
  __builtin_unreachable();
}

std::string launch(const LaunchSpec& spec) {
  if (spec.grid == 0) return {};
  if (spec.cluster == 0 || spec.cluster > 32 || spec.grid % spec.cluster != 0)
    return "grid " + std::to_string(spec.grid) + " is not a whole number of clusters of " +
           std::to_string(spec.cluster);
  if (spec.warp_size != 32 && spec.warp_size != 64) return "warps of 32 or 64 lanes only";
  if (spec.block_threads == 0 || spec.block_threads > 1024 || spec.block_threads % spec.warp_size != 0)
    return "block of " + std::to_string(spec.block_threads) + " threads: whole warps up to 1024 only";
  if (spec.smem_bytes > spec.smem_capacity)
    return std::to_string(spec.smem_bytes) + " bytes of shared memory asked, the emulator has " +
           std::to_string(spec.smem_capacity);
  Launch L;
  L.spec = spec;
  const uint32_t clusters = spec.grid / spec.cluster;
  L.clusters.reserve(clusters);
  for (uint32_t i = 0; i < clusters; ++i) {
    auto cl = std::make_unique<ClusterState>();
    cl->size = spec.cluster;
    cl->threads = (uint64_t)spec.cluster * spec.block_threads;
    L.clusters.push_back(std::move(cl));
  }
  const uint32_t groups = std::max(1u, std::min({spec.groups, clusters}));
  std::vector<std::thread> threads;
  for (uint32_t g = 0; g < groups; ++g)
    for (uint32_t r = 0; r < spec.cluster; ++r) threads.emplace_back(worker, std::ref(L), g, groups, r);
  for (auto& t : threads) t.join();
  return L.error;
}

}  // namespace nsa_emu
