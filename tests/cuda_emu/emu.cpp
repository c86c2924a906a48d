// The scheduler behind emu.h: blocks in sequence, the threads of a block as fibers on one OS thread (an OS
// thread per block in the "tsan" build).
#include "emu.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CUDA_EMU_ASAN 1
#endif

#if defined(CUDA_EMU_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// A fiber's saved context: on x86-64 the stack pointer (callee-saved registers and the FP control words are
// pushed on the fiber's own stack by cuda_emu_switch); elsewhere a ucontext.
#if defined(__x86_64__)
extern "C" void cuda_emu_switch(void** save_sp, void* load_sp);
extern "C" void cuda_emu_trampoline();
asm(R"(
  .pushsection .text
  .globl cuda_emu_switch
  .hidden cuda_emu_switch
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch

  .globl cuda_emu_trampoline
  .hidden cuda_emu_trampoline
  .type cuda_emu_trampoline, @function
cuda_emu_trampoline:
  movq %r12, %rdi
  andq $-16, %rsp
  call *%rbx
  ud2
  .size cuda_emu_trampoline, .-cuda_emu_trampoline
  .popsection
)");
#endif


namespace cuda_emu {

ThreadState* current = nullptr;
uint3 block_idx = {0, 0, 0};
dim3 block_dim, grid_dim;

namespace {

#ifdef CUDA_EMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif
constexpr int kMaxThreads = 1024;

// The "tsan" build: ThreadSanitizer watches the kernels' memory (host_build.py compiles this file without its
// instrumentation, with CUDA_EMU_TSAN: the scheduler's own bookkeeping is not the kernels'). Each thread of a
// block is a fiber of its own to it, switched to without synchronisation, so that only what orders memory on
// a GPU orders it here: a launch's start and end, __syncthreads() and __syncwarp(). The blocks of a launch
// are concurrent on a GPU, and stay unordered here: each block runs on an OS thread of its own, so that its
// __shared__ storage (that thread's TLS) is new memory, and consecutive blocks on two sets of fibers, each
// with its own stacks, so that a race between blocks (the same thread of each adding to one global counter
// without an atomic) is reported too.
#if defined(CUDA_EMU_TSAN)
constexpr int kFiberSets = 2;
#else
constexpr int kFiberSets = 1;
#endif

enum class Wait { kNone, kBlock, kWarp };

struct Fiber {
  ThreadState state;
  std::vector<char> stack;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t context;
#endif
  bool done = false;
  Wait wait = Wait::kNone;
#if defined(CUDA_EMU_TSAN)
  void* tsan = nullptr;  // its ThreadSanitizer fiber
#endif
};

struct WarpState {
  unsigned arrived = 0, expected = 0, exited = 0;
  uint64_t generation = 0;
  uint64_t slots[2][32];
  const char* what = nullptr;
  std::vector<int> waiters;
};

struct Scheduler {
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  std::vector<int> runnable;
  std::vector<int> block_waiters;
  std::vector<int> rank;  // a block run "ahead": thread t's priority (lower runs first), else empty
  int live = 0, threads = 0;
  int base = 0;  // the running block's thread t is fibers[base + t]
  int running = -1;
  uint64_t barrier_generation = 0;  // __syncthreads() of the running block completed so far
#if defined(__x86_64__)
  void* main_sp = nullptr;
#else
  ucontext_t main_context;
#endif
  void (*body)(void*) = nullptr;
  void* context = nullptr;
  std::mt19937_64 rng;
  bool failed = false;
  std::string message;
#ifdef CUDA_EMU_ASAN
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
#endif
#if defined(CUDA_EMU_TSAN)
  void* main_tsan = nullptr;  // the ThreadSanitizer fiber of the OS thread running the block
  std::vector<char> sync;     // the running block's synchronisation objects (block_sync), new for each block
#endif
};

Scheduler sched;
cudaError_t last_error = cudaSuccess;
std::string last_message;
uint64_t seed = 0;
uint64_t launches = 0;
const void* last_kernel = nullptr;

// Happens-before edges for ThreadSanitizer (nothing in the other builds): what a thread did before
// release(o) happens before what a thread does after a later acquire(o).
char launch_begin, launch_end;
#if defined(CUDA_EMU_TSAN)
void release(void* object) { __tsan_release(object); }
void acquire(void* object) { __tsan_acquire(object); }
// Object i of the running block: 0 and 1 for its __syncthreads() (by parity of the generation), 2 + 2w and
// 3 + 2w for warp w's __syncwarp(). Two per barrier: a thread past one may reach the next before a slower
// one has left the first, and must not hand it what it did in between.
void* block_sync(size_t i) { return &sched.sync[i]; }
#else
void release(void*) {}
void acquire(void*) {}
void* block_sync(size_t) { return nullptr; }
#endif


// Switches from the running fiber (or the scheduler when `from` < 0) to `to` (the scheduler when < 0).
// `final`: the fiber that switches away never resumes (it returned, or its launch failed).
void switch_to(int from, int to, bool final = false) {
#ifdef CUDA_EMU_ASAN
  void* fake_stack = nullptr;
  const void* bottom = to < 0 ? sched.main_stack_bottom : sched.fibers[to].stack.data();
  const size_t size = to < 0 ? sched.main_stack_size : sched.fibers[to].stack.size();
  __sanitizer_start_switch_fiber(final ? nullptr : &fake_stack, bottom, size);
#else
  (void)final;
#endif
#if defined(CUDA_EMU_TSAN)
  __tsan_switch_to_fiber(to < 0 ? sched.main_tsan : sched.fibers[to].tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__x86_64__)
  void** save = from < 0 ? &sched.main_sp : &sched.fibers[from].sp;
  void* load = to < 0 ? sched.main_sp : sched.fibers[to].sp;
  cuda_emu_switch(save, load);
#else
  ucontext_t* save = from < 0 ? &sched.main_context : &sched.fibers[from].context;
  ucontext_t* load = to < 0 ? &sched.main_context : &sched.fibers[to].context;
  swapcontext(save, load);
#endif
#ifdef CUDA_EMU_ASAN
  if (from < 0)
    __sanitizer_finish_switch_fiber(fake_stack, &sched.main_stack_bottom, &sched.main_stack_size);
  else
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

// The running fiber gives the CPU back to the scheduler until it is made runnable again.
void block_running() {
  const int self = sched.running;
  switch_to(self, -1);
  current = &sched.fibers[self].state;
}

[[noreturn]] void abandon() {
  // A failed launch: the fiber never resumes (its stack is reused by the next block).
  const int self = sched.running;
  switch_to(self, -1, true);
  abort();
}

void wake(std::vector<int>& waiters) {
  for (int f : waiters) {
    sched.fibers[f].wait = Wait::kNone;
    sched.runnable.push_back(f);
  }
  waiters.clear();
}

void release_warp(WarpState& warp) {
  warp.arrived = 0;
  warp.generation += 1;
  wake(warp.waiters);
}

void open_block_barrier() {
  sched.barrier_generation += 1;
  wake(sched.block_waiters);
}

void fiber_main(void*) {
#ifdef CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);  // the first entry completes a switch too
#endif
  const int self = sched.running;
  current = &sched.fibers[self].state;
  acquire(&launch_begin);
  sched.body(sched.context);
  release(&launch_end);
  Fiber& fiber = sched.fibers[self];
  fiber.done = true;
  sched.live -= 1;
  // The thread leaves later barriers: a block barrier now waiting only for it opens; a warp collective that
  // names it can never complete.
  WarpState& warp = sched.warps[fiber.state.tid / 32];
  warp.exited |= 1u << (fiber.state.tid % 32);
  if (warp.arrived != 0 && ((warp.expected >> (fiber.state.tid % 32)) & 1u))
    fail("a lane exited while its warp waited for it in a *_sync collective");
  if (!sched.block_waiters.empty() && static_cast<int>(sched.block_waiters.size()) == sched.live)
    open_block_barrier();
  switch_to(self, -1, true);
  abort();  // never resumed
}

#if defined(__x86_64__)
void prepare_stack(Fiber& fiber) {
#ifdef CUDA_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(fiber.stack.data(), fiber.stack.size());  // frames left by the last block
#endif
  // What cuda_emu_switch pops: FP control words, r15, r14, r13, r12 (the argument), rbx (the entry),
  // rbp, then the return address: the trampoline.
  auto* top = reinterpret_cast<uint64_t*>(
      (reinterpret_cast<uintptr_t>(fiber.stack.data() + fiber.stack.size()) & ~uintptr_t{15}));
  uint64_t* sp = top - 10;
  uint32_t mxcsr;
  uint16_t fpu;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu));
  sp[0] = mxcsr | (static_cast<uint64_t>(fpu) << 32);
  sp[1] = 0;                                             // r15
  sp[2] = 0;                                             // r14
  sp[3] = 0;                                             // r13
  sp[4] = 0;                                             // r12: fiber_main's argument
  sp[5] = reinterpret_cast<uint64_t>(&fiber_main);       // rbx
  sp[6] = 0;                                             // rbp
  sp[7] = reinterpret_cast<uint64_t>(&cuda_emu_trampoline);
  sp[8] = sp[9] = 0;
  fiber.sp = sp;
}
#else
void fiber_entry() { fiber_main(nullptr); }

void prepare_stack(Fiber& fiber) {
#ifdef CUDA_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(fiber.stack.data(), fiber.stack.size());
#endif
  getcontext(&fiber.context);
  fiber.context.uc_stack.ss_sp = fiber.stack.data();
  fiber.context.uc_stack.ss_size = fiber.stack.size();
  fiber.context.uc_link = nullptr;
  makecontext(&fiber.context, fiber_entry, 0);
}
#endif

// The only thread-local of this file: touching it makes the loader allocate this thread's copy of the
// library's TLS segment, whose other contents are the __shared__ variables of the kernels.
thread_local char tls_anchor;

struct TlsRange {
  char* begin = nullptr;
  size_t size = 0;
};

int find_tls(struct dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<TlsRange*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS || info->dlpi_tls_data == nullptr) continue;
    char* begin = static_cast<char*>(info->dlpi_tls_data);
    if (&tls_anchor >= begin && &tls_anchor < begin + ph.p_memsz) {
      out->begin = begin;
      out->size = ph.p_memsz;
      return 1;
    }
  }
  return 0;
}

TlsRange shared_storage() {
  tls_anchor = 1;
  TlsRange range;
  dl_iterate_phdr(find_tls, &range);
  if (range.begin == nullptr) {
    fprintf(stderr, "cuda_emu: cannot find the TLS segment that holds __shared__ variables\n");
    abort();
  }
  return range;
}

// Garbage in every __shared__ variable before a block runs: a byte pattern that changes from block to block
// (0xff makes floats NaN and ints -1).
void scribble_shared(uint64_t block) {
  static const unsigned char patterns[] = {0xff, 0x7f, 0xa5, 0x80, 0x01, 0xc3};
  static TlsRange range;
  static const char* anchor = nullptr;  // where tls_anchor was when range was found
  if (anchor != &tls_anchor) {  // TLS is per OS thread (and each block of the "tsan" build has its own)
    range = shared_storage();
    anchor = &tls_anchor;
  }
  memset(range.begin, patterns[(block + seed) % sizeof(patterns)], range.size);
}

void run_block(uint64_t block_number) {
  const int n = sched.threads;
  sched.live = n;
  sched.base = static_cast<int>(block_number % kFiberSets) * n;
  sched.barrier_generation = 0;
  sched.runnable.clear();
  sched.block_waiters.clear();
#if defined(CUDA_EMU_TSAN)
  sched.main_tsan = __tsan_get_current_fiber();
  sched.sync = std::vector<char>(2 + 2 * ((n + 31) / 32));  // freed objects take their history with them
#endif
  for (int w = 0; w < (n + 31) / 32; ++w) {
    WarpState& warp = sched.warps[w];
    warp.arrived = warp.expected = 0;
    warp.generation = 0;
    warp.waiters.clear();
    const int lanes = n - w * 32 < 32 ? n - w * 32 : 32;
    warp.exited = lanes == 32 ? 0u : ~((1u << lanes) - 1u);  // missing lanes of a partial warp
  }
  for (int t = 0; t < n; ++t) {
    Fiber& fiber = sched.fibers[sched.base + t];
    fiber.done = false;
    fiber.wait = Wait::kNone;
    fiber.state.tid = t;
    fiber.state.thread_idx = uint3{t % block_dim.x, (t / block_dim.x) % block_dim.y, t / (block_dim.x * block_dim.y)};
    prepare_stack(fiber);
    sched.runnable.push_back(sched.base + t);
  }
  scribble_shared(block_number);
  release(&launch_begin);  // what the launching thread did before the launch, and the garbage: before the block
  // Half the blocks pick at random among the runnable threads; the other half run "ahead": the warps in a
  // random order, each as far as it can go before the next one starts. That is the widest skew between
  // warps, which a missing __syncthreads() (one warp reading shared memory another has not written yet, or
  // writing it before another has read it) cannot survive.
  sched.rank.clear();
  if (sched.rng() & 1) {
    std::vector<int> order((n + 31) / 32);
    for (size_t w = 0; w < order.size(); ++w) order[w] = static_cast<int>(w);
    std::shuffle(order.begin(), order.end(), sched.rng);
    sched.rank.resize(n);
    for (int t = 0; t < n; ++t) sched.rank[t] = order[t / 32] * 32 + t % 32;
  }
  while (sched.live > 0 && !sched.failed) {
    if (sched.runnable.empty()) {
      int at_block = 0, at_warp = 0;
      for (int t = 0; t < n; ++t) {
        at_block += sched.fibers[sched.base + t].wait == Wait::kBlock;
        at_warp += sched.fibers[sched.base + t].wait == Wait::kWarp;
      }
      char text[200];
      snprintf(text, sizeof(text), "deadlock in block %u: %d threads wait at __syncthreads, %d at warp collectives",
               block_idx.x, at_block, at_warp);
      sched.failed = true;
      sched.message = text;
      break;
    }
    size_t pick = sched.rng() % sched.runnable.size();
    if (!sched.rank.empty()) {
      for (size_t i = 0; i < sched.runnable.size(); ++i)
        if (sched.rank[sched.runnable[i] - sched.base] < sched.rank[sched.runnable[pick] - sched.base]) pick = i;
    }
    const int next = sched.runnable[pick];
    sched.runnable[pick] = sched.runnable.back();
    sched.runnable.pop_back();
    sched.running = next;
    current = &sched.fibers[next].state;
    switch_to(-1, next);
    sched.running = -1;
  }
}

}  // namespace

void fail(const char* message) {
  if (!sched.failed) {
    sched.failed = true;
    sched.message = message;
  }
  if (sched.running >= 0) abandon();
}

void block_barrier() {
  const int self = sched.running;
  if (self < 0) fail("__syncthreads outside a kernel");
  void* sync = block_sync(sched.barrier_generation & 1);
  release(sync);
  sched.fibers[self].wait = Wait::kBlock;
  sched.block_waiters.push_back(self);
  if (static_cast<int>(sched.block_waiters.size()) == sched.live) {
    open_block_barrier();  // everyone (this thread too) runnable again, in random order
  }
  block_running();
  acquire(sync);
}

const uint64_t* warp_exchange(unsigned mask, uint64_t bits, const char* what, bool orders_memory) {
  const int self = sched.running;
  if (self < 0) fail("a warp collective outside a kernel");
  const int lane = sched.fibers[self].state.tid % 32;
  WarpState& warp = sched.warps[sched.fibers[self].state.tid / 32];
  if (!((mask >> lane) & 1u)) fail("a lane called a *_sync collective with a mask that leaves it out");
  if (mask & warp.exited) fail("a *_sync collective names a lane that has exited");
  if (warp.arrived == 0) {
    warp.expected = mask;
    warp.what = what;
  } else if (warp.expected != mask || strcmp(warp.what, what) != 0) {
    fail("lanes of a warp met in different *_sync collectives or with different masks");
  }
  const uint64_t generation = warp.generation;
  void* sync = orders_memory ? block_sync(2 + 2 * (sched.fibers[self].state.tid / 32) + (generation & 1)) : nullptr;
  if (orders_memory) release(sync);
  warp.slots[generation & 1][lane] = bits;
  warp.arrived |= 1u << lane;
  sched.fibers[self].wait = Wait::kWarp;
  warp.waiters.push_back(self);
  if (warp.arrived == warp.expected) release_warp(warp);
  block_running();
  if (orders_memory) acquire(sync);
  return warp.slots[generation & 1];
}

void run_grid(const void* kernel, dim3 grid, dim3 block, void (*body)(void*), void* context) {
  last_kernel = kernel;
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (sched.fibers.size() < threads * kFiberSets) {
    sched.fibers.resize(threads * kFiberSets);
    for (Fiber& fiber : sched.fibers) {
      if (fiber.stack.empty()) fiber.stack.resize(kStackBytes);
#if defined(CUDA_EMU_TSAN)
      if (fiber.tsan == nullptr) fiber.tsan = __tsan_create_fiber(0);
#endif
    }
  }
  if (sched.warps.size() < (threads + 31) / 32) sched.warps.resize((threads + 31) / 32);
  // Room for every thread in the scheduler's lists, so that threads never reallocate them (the "tsan" build
  // would see a thread's malloc and memmove touch memory another thread filled).
  sched.runnable.reserve(threads * kFiberSets);
  sched.block_waiters.reserve(threads * kFiberSets);
  for (WarpState& warp : sched.warps) warp.waiters.reserve(32);
  sched.threads = static_cast<int>(threads);
  sched.body = body;
  sched.context = context;
  sched.failed = false;
  sched.message.clear();
  sched.rng.seed(seed * 0x9e3779b97f4a7c15ull + launches++);
  block_dim = block;
  grid_dim = grid;
  const uint64_t blocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  const bool backwards = sched.rng() & 1;  // blocks have no order: try both
  for (uint64_t i = 0; i < blocks && !sched.failed; ++i) {
    const uint64_t b = backwards ? blocks - 1 - i : i;
    block_idx = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                      static_cast<unsigned>(b / (static_cast<uint64_t>(grid.x) * grid.y))};
#if defined(CUDA_EMU_TSAN)
    pthread_t thread;
    if (pthread_create(&thread, nullptr, [](void* block) -> void* {
          run_block(*static_cast<uint64_t*>(block));
          return nullptr;
        }, const_cast<uint64_t*>(&b)) != 0) {
      fprintf(stderr, "cuda_emu: cannot start a thread for a block\n");
      abort();
    }
    pthread_join(thread, nullptr);
#else
    run_block(b);
#endif
  }
  acquire(&launch_end);  // what the threads did, the launching thread (and the next launch) sees
  current = nullptr;
  if (sched.failed) {
    last_error = cudaErrorLaunchFailure;
    last_message = "emulated launch failed: " + sched.message;
  }
}

int env_int(const char* name, int fallback) {
  const char* value = getenv(name);
  return value != nullptr && *value ? atoi(value) : fallback;
}

}  // namespace cuda_emu

using cuda_emu::last_error;

cudaError_t cudaGetLastError() {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorLaunchFailure: return cuda_emu::last_message.c_str();
  }
  return "unknown error";
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = cuda_emu::env_int("CUDA_EMU_SMS", 2);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  if (bytes > 0 && ptr == nullptr) return cudaErrorInvalidValue;
  if (bytes > 0) memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = cuda_emu::env_int("CUDA_EMU_DRIVER_VERSION", CUDART_VERSION);
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

// Blocks in the grid of the latest launch (tests check how a launcher sized it).
extern "C" uint64_t cuda_emu_last_grid_blocks() {
  return static_cast<uint64_t>(cuda_emu::grid_dim.x) * cuda_emu::grid_dim.y * cuda_emu::grid_dim.z;
}

// The kernel of the latest launch, as its offset in the library that holds it (0 before any launch): nm
// names it, template arguments included.
extern "C" uint64_t cuda_emu_last_kernel_offset() {
  Dl_info info;
  if (cuda_emu::last_kernel == nullptr || dladdr(cuda_emu::last_kernel, &info) == 0) return 0;
  return reinterpret_cast<uintptr_t>(cuda_emu::last_kernel) - reinterpret_cast<uintptr_t>(info.dli_fbase);
}

// The seed of the thread order at barriers and of the shared-memory garbage (tests vary it).
extern "C" void cuda_emu_set_seed(uint64_t value) {
  cuda_emu::seed = value;
  cuda_emu::launches = 0;
}
