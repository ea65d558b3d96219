// A decoder layer's four decode matmuls (one row) in one persistent launch whose weights never stop
// streaming: a producer warp per SM copies the weight tiles of its programs' items, phase after
// phase, into a ring of shared-memory stages (asynchronous copies completing on mbarriers), while four
// consumer warps multiply them and meet the other SMs at a grid barrier between phases. The
// producer does not wait at those barriers: the next phase's weights depend on nothing the
// barrier waits for, so they arrive while the consumers wait. bench/kernels_stream_layer.py
// times it against the engine's launches; see there for the question it answers.
//
// Each item is kernels.matmul's split program (a 64-column tile, one K segment) and sums as it
// does: per output, m16n8k16 bf16 MMAs with fp32 accumulation chained from zero in increasing K,
// then `0 + part`. So the sums must equal matmul_partials' bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int BLOCK_K = 64;
constexpr int ROW_BYTES = BLOCK_K * 2;
constexpr int ROW_STRIDE = ROW_BYTES + 16;   // padded: a warp's fragment loads hit 32 banks
constexpr int STAGE_BYTES = 64 * ROW_STRIDE; // room for the widest tile
constexpr int CONSUMERS = 4;                 // warps, a quarter of a tile's columns each
constexpr int THREADS = 32 * (1 + CONSUMERS);
constexpr int PHASES = 4;
constexpr int MAX_K = 14336;

struct Phase {
  const __nv_bfloat16* a;   // [K], the phase's input row
  const __nv_bfloat16* b;   // [N, K], an nn.Linear weight (the engine's operand is its transpose)
  float* parts;             // [segments, N], a segment's fp32 sums
  int n, k, segments, segment_steps;
};

struct Layer {
  Phase phase[PHASES];
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count));
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ void copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst)), "l"(src) : "memory");
}

// The barrier counts one arrival of this thread once its copies issued so far have landed.
__device__ __forceinline__ void arrive_when_copied(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(shared_address(bar)) : "memory");
}

__device__ __forceinline__ void mma(float* c, uint32_t a_lo, uint32_t a_hi, uint32_t b_lo, uint32_t b_hi) {
  // Every row of A is the one input row, as the Triton kernel wraps its 16 tile rows onto row 0.
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%5,%5}, {%6,%7}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a_lo), "r"(a_hi), "r"(b_lo), "r"(b_hi));
}

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(32 * CONSUMERS) : "memory");
}

// Three counters used in turn: the last program to arrive at one zeroes the one before, which
// every program has left by then; the third is zeroed at the next launch's first barrier.
__device__ void grid_barrier(int* counts, int index) {
  consumers_sync();
  if (threadIdx.x == 32) {
    __threadfence();
    int seen = atomicAdd(&counts[index], 1) + 1;
    if (seen == static_cast<int>(gridDim.x)) counts[(index + 2) % 3] = 0;
    while (seen < static_cast<int>(gridDim.x)) seen = *reinterpret_cast<volatile int*>(&counts[index]);
    __threadfence();
  }
  consumers_sync();
}

// flags: NO_BARRIERS (a bound: phases that wait for nothing), NO_MATH (consumers only hand stages back).
constexpr int NO_BARRIERS = 1, NO_MATH = 2;

template <int BLOCK_N>
__global__ void __launch_bounds__(THREADS, 1) stream_layer(Layer layer, int* counts, int stages, int flags) {
  constexpr int BLOCKS = BLOCK_N / 8 / CONSUMERS;   // n8 MMA blocks a consumer warp owns
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + stages;
  __nv_bfloat16* a_row = reinterpret_cast<__nv_bfloat16*>(smem + 16 * stages);
  unsigned char* ring = smem + 16 * stages + MAX_K * 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      barrier_init(&full[s], 32);   // the producer's lanes
      barrier_init(&empty[s], CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  int used = 0;   // stages filled (producer) or emptied (consumers) so far, over all phases
  if (warp == 0) {
    for (int p = 0; p < PHASES; ++p) {
      const Phase ph = layer.phase[p];
      const int steps = ph.k / BLOCK_K;
      for (int item = blockIdx.x; item < ph.n / BLOCK_N * ph.segments; item += gridDim.x) {
        const int n0 = item / ph.segments * BLOCK_N, first = item % ph.segments * ph.segment_steps;
        const int last = min(first + ph.segment_steps, steps);
        for (int step = first; step < last; ++step, ++used) {
          const int s = used % stages;
          barrier_wait(&empty[s], ((used / stages) & 1) ^ 1);
          // 16-byte copies, eight lanes a row: each row's 128 bytes are one coalesced read.
#pragma unroll
          for (int i = lane; i < BLOCK_N * ROW_BYTES / 16; i += 32) {
            const int r = i / (ROW_BYTES / 16), chunk = i % (ROW_BYTES / 16);
            copy16(ring + s * STAGE_BYTES + r * ROW_STRIDE + chunk * 16,
                   ph.b + static_cast<int64_t>(n0 + r) * ph.k + step * BLOCK_K + chunk * 8);
          }
          arrive_when_copied(&full[s]);
        }
      }
    }
    return;
  }

  const int g = lane / 4, t = lane % 4, col = (warp - 1) * BLOCK_N / CONSUMERS;
  for (int p = 0; p < PHASES; ++p) {
    const Phase ph = layer.phase[p];
    if (p && !(flags & NO_BARRIERS)) grid_barrier(counts, p - 1);
    consumers_sync();   // every consumer warp done with the last phase's row before it is overwritten
    for (int i = threadIdx.x - 32; i < ph.k / 2; i += 32 * CONSUMERS)
      reinterpret_cast<uint32_t*>(a_row)[i] = reinterpret_cast<const uint32_t*>(ph.a)[i];
    consumers_sync();
    const int steps = ph.k / BLOCK_K;
    for (int item = blockIdx.x; item < ph.n / BLOCK_N * ph.segments; item += gridDim.x) {
      const int segment = item % ph.segments, n0 = item / ph.segments * BLOCK_N;
      const int first = segment * ph.segment_steps, last = min(first + ph.segment_steps, steps);
      float c[BLOCKS][4] = {};
      for (int step = first; step < last; ++step, ++used) {
        const int s = used % stages;
        barrier_wait(&full[s], (used / stages) & 1);
        const unsigned char* tile = ring + s * STAGE_BYTES;
#pragma unroll
        for (int kk = 0; kk < BLOCK_K * !(flags & NO_MATH); kk += 16) {
          const uint32_t* a = reinterpret_cast<const uint32_t*>(a_row + step * BLOCK_K + kk + 2 * t);
#pragma unroll
          for (int blk = 0; blk < BLOCKS; ++blk) {
            const unsigned char* b = tile + (col + blk * 8 + g) * ROW_STRIDE + (kk + 2 * t) * 2;
            mma(c[blk], a[0], a[4], *reinterpret_cast<const uint32_t*>(b),
                *reinterpret_cast<const uint32_t*>(b + 16));
          }
        }
        __syncwarp();
        if (lane == 0) barrier_arrive(&empty[s]);
      }
      if (g == 0) {
#pragma unroll
        for (int blk = 0; blk < BLOCKS; ++blk) {
          float* out = ph.parts + static_cast<int64_t>(segment) * ph.n + n0 + col + blk * 8 + 2 * t;
          out[0] = 0.0f + c[blk][0];
          out[1] = 0.0f + c[blk][1];
        }
      }
    }
  }
}

template <int BLOCK_N>
int launch(const Layer& layer, int* counts, int programs, int stages, int flags, cudaStream_t stream) {
  const int bytes = 16 * stages + MAX_K * 2 + stages * STAGE_BYTES;
  cudaError_t err = cudaFuncSetAttribute(stream_layer<BLOCK_N>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return static_cast<int>(err);
  stream_layer<BLOCK_N><<<programs, THREADS, bytes, stream>>>(layer, counts, stages, flags);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int stream_layer_launch(const uint64_t* a, const uint64_t* b, const uint64_t* parts, const int* shape,
                                   int* counts, int programs, int stages, int block_n, int flags, uint64_t stream) {
  Layer layer;
  for (int p = 0; p < PHASES; ++p) {
    const int* s = shape + 4 * p;
    layer.phase[p] = Phase{reinterpret_cast<const __nv_bfloat16*>(a[p]), reinterpret_cast<const __nv_bfloat16*>(b[p]),
                           reinterpret_cast<float*>(parts[p]), s[0], s[1], s[2], s[3]};
    if (s[1] > MAX_K || s[0] % 64 || s[1] % BLOCK_K) return -1;
  }
  cudaStream_t st = reinterpret_cast<cudaStream_t>(stream);
  return block_n == 32 ? launch<32>(layer, counts, programs, stages, flags, st)
                       : launch<64>(layer, counts, programs, stages, flags, st);
}
