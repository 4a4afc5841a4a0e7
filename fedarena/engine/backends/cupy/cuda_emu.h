// CPU emulation of the CUDA execution model, for checking generated and hand-written kernels
// on machines without a GPU.  The kernel source is compiled unchanged by a C++ compiler with this
// header in front of it:
//   - blockIdx / threadIdx / blockDim / gridDim are globals the launcher sets before it runs a
//     thread; every block of the grid runs in turn, one after another;
//   - a kernel that calls __syncthreads() runs each thread of a block as a cooperative fibre
//     (its own stack; a register switch on x86-64, ucontext elsewhere): __syncthreads() switches back to the scheduler, which resumes the next thread,
//     so no thread passes a barrier before every thread of its block has reached it;
//     a kernel without barriers runs its threads as plain sequential calls;
//   - __shared__ becomes `static` (one object shared by all threads; blocks never overlap in time,
//     so this is exactly one shared-memory array per block), local variables live on each
//     fibre's own stack (registers);
//   - float4 is a 16-byte aligned struct, so reinterpret_cast'ed 128-bit loads keep their meaning;
//   - float16 and bfloat16 conversions (cuda_emu::f32_to_f16 and friends, used by the generated
//     kernels' fe_half/fe_bf16 helpers where the device has `cvt` instructions) round to nearest
//     even, subnormals and overflow to infinity included, as `cvt.rn.f16.f32` / `cvt.rn.bf16.f32` do.
// Launchers follow the driver API's cuLaunchKernel: `args[k]` points at the k-th argument.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

struct dim3 {
  unsigned x, y, z;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

namespace cuda_emu {
static dim3 grid_dim, block_dim, block_idx, thread_idx;
typedef void (*Body)(void**);
static Body body = nullptr;
static void** body_args = nullptr;
static unsigned current = 0;
static const size_t kStack = 128 * 1024;

#if defined(__x86_64__)
// A fibre switch saves the callee-saved registers on the old stack and pops them from the new
// one (System V x86-64 ABI); ucontext's swapcontext would also make a signal-mask system call
// on every switch, which costs more than the kernels' arithmetic.
extern "C" void cuda_emu_swap(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .hidden cuda_emu_swap
  .globl cuda_emu_swap
  .type cuda_emu_swap,@function
cuda_emu_swap:
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
  .size cuda_emu_swap, .-cuda_emu_swap
)");
struct Fibre {
  void* sp;
  int done;
};
static void* scheduler_sp = nullptr;
static Fibre* fibres = nullptr;
static char* stacks = nullptr;
static unsigned capacity = 0;

static void fibre_entry() {
  body(body_args);
  fibres[current].done = 1;
  void* dead;
  cuda_emu_swap(&dead, scheduler_sp);  // never resumed
}
static inline void fibre_start(unsigned t) {
  char* top = stacks + static_cast<size_t>(t + 1) * kStack;
  uintptr_t a = (reinterpret_cast<uintptr_t>(top) - 64) & ~static_cast<uintptr_t>(15);
  void** slot = reinterpret_cast<void**>(a);
  slot[0] = reinterpret_cast<void*>(&fibre_entry);  // popped by `ret`: entered with rsp = 8 mod 16
  for (int r = 1; r <= 6; ++r) slot[-r] = nullptr;   // rbp, rbx, r12-r15
  fibres[t].sp = slot - 6;
  fibres[t].done = 0;
}
static inline void fibre_resume(unsigned t) { cuda_emu_swap(&scheduler_sp, fibres[t].sp); }
static inline void syncthreads() {
  if (body == nullptr || fibres == nullptr) return;
  cuda_emu_swap(&fibres[current].sp, scheduler_sp);
}
#else
struct Fibre {
  ucontext_t ctx;
  int done;
};
static ucontext_t scheduler;
static Fibre* fibres = nullptr;
static char* stacks = nullptr;
static unsigned capacity = 0;
static void fibre_entry() {
  body(body_args);
  fibres[current].done = 1;  // returning resumes uc_link: the scheduler
}
static inline void fibre_start(unsigned t) {
  Fibre& fb = fibres[t];
  getcontext(&fb.ctx);
  fb.ctx.uc_stack.ss_sp = stacks + static_cast<size_t>(t) * kStack;
  fb.ctx.uc_stack.ss_size = kStack;
  fb.ctx.uc_link = &scheduler;
  fb.done = 0;
  makecontext(&fb.ctx, fibre_entry, 0);
}
static inline void fibre_resume(unsigned t) { swapcontext(&scheduler, &fibres[t].ctx); }
static inline void syncthreads() {
  if (body == nullptr || fibres == nullptr) return;
  swapcontext(&fibres[current].ctx, &scheduler);
}
#endif

static inline void set_thread(unsigned t) {
  thread_idx.x = t % block_dim.x;
  thread_idx.y = (t / block_dim.x) % block_dim.y;
  thread_idx.z = t / (block_dim.x * block_dim.y);
}

// Run the grid: every block in order; threads as fibres when the kernel has barriers.
static int launch(dim3 g, dim3 b, bool barriers, Body f, void** args) {
  grid_dim = g;
  block_dim = b;
  unsigned n = b.x * b.y * b.z;
  if (n == 0 || n > 1024) return 1;  // the CUDA limit on threads per block
  if (barriers && n > capacity) {
    free(fibres);
    free(stacks);
    fibres = static_cast<Fibre*>(calloc(n, sizeof(Fibre)));
    stacks = static_cast<char*>(malloc(n * kStack));
    if (!fibres || !stacks) return 2;
    capacity = n;
  }
  body = f;
  body_args = args;
  for (unsigned bz = 0; bz < g.z; ++bz)
    for (unsigned by = 0; by < g.y; ++by)
      for (unsigned bx = 0; bx < g.x; ++bx) {
        block_idx = dim3{bx, by, bz};
        if (!barriers) {
          for (unsigned t = 0; t < n; ++t) {
            set_thread(t);
            f(args);
          }
          continue;
        }
        for (unsigned t = 0; t < n; ++t) fibre_start(t);
        bool alive = true;
        while (alive) {  // one round: every live thread runs up to its next barrier (or its end)
          alive = false;
          for (unsigned t = 0; t < n; ++t) {
            if (fibres[t].done) continue;
            current = t;
            set_thread(t);
            fibre_resume(t);
            if (!fibres[t].done) alive = true;
          }
        }
      }
  body = nullptr;
  return 0;
}
}  // namespace cuda_emu

#define gridDim cuda_emu::grid_dim
#define blockDim cuda_emu::block_dim
#define blockIdx cuda_emu::block_idx
#define threadIdx cuda_emu::thread_idx
#define __syncthreads() cuda_emu::syncthreads()
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __ldg(p) (*(p))
// CUDA's bit-cast intrinsics
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, sizeof d); return d; }
// CUDA's high word of a 64x64-bit unsigned product
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
// blocks and threads run one at a time: an atomic add is a plain add
template <typename T> static inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
#define __align__(n) __attribute__((aligned(n)))

namespace cuda_emu {
// IEEE binary16 from binary32, round to nearest even (as PTX cvt.rn.f16.f32)
static inline unsigned short f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<unsigned short>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays NaN
  if (ax >= 0x477ff000u) return static_cast<unsigned short>(sign | 0x7c00u);  // >= 65520: infinity
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal half (units of 2^-24) or zero
    uint32_t e = ax >> 23;
    if (e < 102) return static_cast<unsigned short>(sign);  // below 2^-25
    uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<unsigned short>(sign | q);
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13), rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<unsigned short>(sign | h);
}
static inline float f16_to_f32(unsigned short h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0x1fu) {
    bits = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {
    float v = ldexpf(static_cast<float>(m), -24);  // exact
    return sign ? -v : v;
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
// bfloat16: the high half of a binary32, round to nearest even (as PTX cvt.rn.bf16.f32)
static inline unsigned short f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((x >> 16) | 0x40u);
  return static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float bf16_to_f32(unsigned short b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
}  // namespace cuda_emu
