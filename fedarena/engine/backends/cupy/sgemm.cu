// Hand-written single-precision GEMM, C = A B for row-major A (M x K), B (K x N), C (M x N),
// kept as the sequence of optimisation steps of the accelerator chapter, one kernel per step so a
// benchmark shows what each step gains:
//   1. sgemm_naive     one thread per element of C, operands read from global memory;
//   2. sgemm_smem      16 x 16 tiles of A and B staged in shared memory (each global value read
//                      once per tile instead of once per product);
//   3. sgemm_regblock  128 x 128 block tiles, 8-deep, each of 256 threads computing an 8 x 8
//                      micro-tile in registers from two 8-vectors per k (register blocking:
//                      64 multiply-adds per 16 shared-memory reads);
//   4. sgemm_vec       step 3 with 128-bit (float4) global loads and stores and float4 reads of
//                      the shared tiles, where the row length and the alignment allow them;
//   5. sgemm_dbuf      step 4 with double buffering: the next tile is fetched into registers while
//                      the current one is multiplied, then stored into the other shared buffer,
//                      one barrier per tile.
// Every kernel handles any M, N, K: loads outside the matrices read zeros, stores are bounds
// checked, and vector accesses fall back to scalar ones at ragged edges or misaligned pointers.
// (Tiling and register blocking as in Volkov & Demmel, "Benchmarking GPUs to tune dense linear
// algebra", SC 2008; the step-by-step structure follows the usual SGEMM optimisation walk-through.)

#define SG_BM 128
#define SG_BN 128
#define SG_BK 8
#define SG_TM 8
#define SG_TN 8
#define SG_THREADS 256
#define SG_TILE 16

extern "C" __global__ void sgemm_naive(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < M && col < N) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[(long long)row * K + k] * B[(long long)k * N + col];
    C[(long long)row * N + col] = acc;
  }
}

extern "C" __global__ void sgemm_smem(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  __shared__ float As[SG_TILE][SG_TILE];
  __shared__ float Bs[SG_TILE][SG_TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * SG_TILE + ty;
  const int col = blockIdx.x * SG_TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += SG_TILE) {
    As[ty][tx] = (row < M && k0 + tx < K) ? A[(long long)row * K + k0 + tx] : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(long long)(k0 + ty) * N + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < SG_TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[(long long)row * N + col] = acc;
}

// -- steps 3-5 share the micro-kernel: 8 x 8 outputs per thread from the (BK x BM) transposed A
// tile and the (BK x BN) B tile in shared memory.

extern "C" __global__ void __launch_bounds__(SG_THREADS) sgemm_regblock(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  __shared__ float As[SG_BK][SG_BM];
  __shared__ float Bs[SG_BK][SG_BN];
  const int tid = threadIdx.x;
  const int trow = tid / (SG_BN / SG_TN), tcol = tid % (SG_BN / SG_TN);
  const int m0 = blockIdx.y * SG_BM, n0 = blockIdx.x * SG_BN;
  float acc[SG_TM][SG_TN];
#pragma unroll
  for (int i = 0; i < SG_TM; ++i)
#pragma unroll
    for (int j = 0; j < SG_TN; ++j) acc[i][j] = 0.0f;
  float a[SG_TM], b[SG_TN];
  for (int k0 = 0; k0 < K; k0 += SG_BK) {
#pragma unroll
    for (int l = 0; l < (SG_BM * SG_BK) / SG_THREADS; ++l) {
      const int idx = tid + l * SG_THREADS;
      const int r = idx / SG_BK, c = idx % SG_BK;
      As[c][r] = (m0 + r < M && k0 + c < K) ? A[(long long)(m0 + r) * K + k0 + c] : 0.0f;
    }
#pragma unroll
    for (int l = 0; l < (SG_BK * SG_BN) / SG_THREADS; ++l) {
      const int idx = tid + l * SG_THREADS;
      const int r = idx / SG_BN, c = idx % SG_BN;
      Bs[r][c] = (k0 + r < K && n0 + c < N) ? B[(long long)(k0 + r) * N + n0 + c] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < SG_BK; ++k) {
#pragma unroll
      for (int i = 0; i < SG_TM; ++i) a[i] = As[k][trow * SG_TM + i];
#pragma unroll
      for (int j = 0; j < SG_TN; ++j) b[j] = Bs[k][tcol * SG_TN + j];
#pragma unroll
      for (int i = 0; i < SG_TM; ++i)
#pragma unroll
        for (int j = 0; j < SG_TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < SG_TM; ++i) {
    const int r = m0 + trow * SG_TM + i;
    if (r >= M) break;
#pragma unroll
    for (int j = 0; j < SG_TN; ++j) {
      const int c = n0 + tcol * SG_TN + j;
      if (c < N) C[(long long)r * N + c] = acc[i][j];
    }
  }
}

// One thread's share of a tile fetch for steps 4-5: a float4 of A (row r of the 128 x 8 tile,
// columns c4..c4+3) and a float4 of B (row rb of the 8 x 128 tile, columns cb..cb+3), scalar at
// ragged edges or when the rows are not 16-byte aligned.
__device__ __forceinline__ float4 sg_load4(const float* __restrict__ P, long long rowlen, int r, int c, int rows, int cols, bool vec) {
  const float* p = P + (long long)r * rowlen + c;
  if (vec && r < rows && c + 3 < cols) return *reinterpret_cast<const float4*>(p);
  float4 v;
  v.x = (r < rows && c < cols) ? p[0] : 0.0f;
  v.y = (r < rows && c + 1 < cols) ? p[1] : 0.0f;
  v.z = (r < rows && c + 2 < cols) ? p[2] : 0.0f;
  v.w = (r < rows && c + 3 < cols) ? p[3] : 0.0f;
  return v;
}

__device__ __forceinline__ void sg_store_tile(float (*As)[SG_BM], float (*Bs)[SG_BN], float4 av, float4 bv, int ra, int ca, int rb, int cb) {
  As[ca + 0][ra] = av.x;
  As[ca + 1][ra] = av.y;
  As[ca + 2][ra] = av.z;
  As[ca + 3][ra] = av.w;
  *reinterpret_cast<float4*>(&Bs[rb][cb]) = bv;
}

__device__ __forceinline__ void sg_micro(const float (*As)[SG_BM], const float (*Bs)[SG_BN], int trow, int tcol, float (*acc)[SG_TN]) {
  float a[SG_TM], b[SG_TN];
#pragma unroll
  for (int k = 0; k < SG_BK; ++k) {
    const float4 a0 = *reinterpret_cast<const float4*>(&As[k][trow * SG_TM]);
    const float4 a1 = *reinterpret_cast<const float4*>(&As[k][trow * SG_TM + 4]);
    const float4 b0 = *reinterpret_cast<const float4*>(&Bs[k][tcol * SG_TN]);
    const float4 b1 = *reinterpret_cast<const float4*>(&Bs[k][tcol * SG_TN + 4]);
    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w; a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w; b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
    for (int i = 0; i < SG_TM; ++i)
#pragma unroll
      for (int j = 0; j < SG_TN; ++j) acc[i][j] += a[i] * b[j];
  }
}

__device__ __forceinline__ void sg_write(float* __restrict__ C, const float (*acc)[SG_TN], int M, int N, int r0, int c0, bool vec) {
#pragma unroll
  for (int i = 0; i < SG_TM; ++i) {
    const int r = r0 + i;
    if (r >= M) break;
    float* row = C + (long long)r * N;
#pragma unroll
    for (int j = 0; j < SG_TN; j += 4) {
      const int c = c0 + j;
      if (vec && c + 3 < N) {
        float4 v;
        v.x = acc[i][j];
        v.y = acc[i][j + 1];
        v.z = acc[i][j + 2];
        v.w = acc[i][j + 3];
        *reinterpret_cast<float4*>(row + c) = v;
      } else {
        for (int q = 0; q < 4; ++q)
          if (c + q < N) row[c + q] = acc[i][j + q];
      }
    }
  }
}

#define SG_ALIGNED(p) ((((unsigned long long)(p)) & 15ULL) == 0ULL)

extern "C" __global__ void __launch_bounds__(SG_THREADS) sgemm_vec(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  alignas(16) __shared__ float As[SG_BK][SG_BM];
  alignas(16) __shared__ float Bs[SG_BK][SG_BN];
  const int tid = threadIdx.x;
  const int trow = tid / (SG_BN / SG_TN), tcol = tid % (SG_BN / SG_TN);
  const int m0 = blockIdx.y * SG_BM, n0 = blockIdx.x * SG_BN;
  const bool va = (K % 4 == 0) && SG_ALIGNED(A), vb = (N % 4 == 0) && SG_ALIGNED(B), vc = (N % 4 == 0) && SG_ALIGNED(C);
  const int ra = tid / (SG_BK / 4), ca = (tid % (SG_BK / 4)) * 4;  // 128 rows x 2 float4
  const int rb = tid / (SG_BN / 4), cb = (tid % (SG_BN / 4)) * 4;  // 8 rows x 32 float4
  float acc[SG_TM][SG_TN];
#pragma unroll
  for (int i = 0; i < SG_TM; ++i)
#pragma unroll
    for (int j = 0; j < SG_TN; ++j) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += SG_BK) {
    const float4 av = sg_load4(A, K, m0 + ra, k0 + ca, M, K, va);
    const float4 bv = sg_load4(B, N, k0 + rb, n0 + cb, K, N, vb);
    sg_store_tile(As, Bs, av, bv, ra, ca, rb, cb);
    __syncthreads();
    sg_micro(As, Bs, trow, tcol, acc);
    __syncthreads();
  }
  sg_write(C, acc, M, N, m0 + trow * SG_TM, n0 + tcol * SG_TN, vc);
}

extern "C" __global__ void __launch_bounds__(SG_THREADS) sgemm_dbuf(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  alignas(16) __shared__ float As[2][SG_BK][SG_BM];
  alignas(16) __shared__ float Bs[2][SG_BK][SG_BN];
  const int tid = threadIdx.x;
  const int trow = tid / (SG_BN / SG_TN), tcol = tid % (SG_BN / SG_TN);
  const int m0 = blockIdx.y * SG_BM, n0 = blockIdx.x * SG_BN;
  const bool va = (K % 4 == 0) && SG_ALIGNED(A), vb = (N % 4 == 0) && SG_ALIGNED(B), vc = (N % 4 == 0) && SG_ALIGNED(C);
  const int ra = tid / (SG_BK / 4), ca = (tid % (SG_BK / 4)) * 4;
  const int rb = tid / (SG_BN / 4), cb = (tid % (SG_BN / 4)) * 4;
  float acc[SG_TM][SG_TN];
#pragma unroll
  for (int i = 0; i < SG_TM; ++i)
#pragma unroll
    for (int j = 0; j < SG_TN; ++j) acc[i][j] = 0.0f;
  const int tiles = (K + SG_BK - 1) / SG_BK;
  if (tiles > 0) {
    sg_store_tile(As[0], Bs[0], sg_load4(A, K, m0 + ra, ca, M, K, va), sg_load4(B, N, rb, n0 + cb, K, N, vb), ra, ca, rb, cb);
    __syncthreads();
  }
  int cur = 0;
  for (int t = 0; t < tiles; ++t) {
    const bool more = t + 1 < tiles;
    float4 av, bv;
    if (more) {  // fetch the next tile while this one is multiplied
      const int k1 = (t + 1) * SG_BK;
      av = sg_load4(A, K, m0 + ra, k1 + ca, M, K, va);
      bv = sg_load4(B, N, k1 + rb, n0 + cb, K, N, vb);
    }
    sg_micro(As[cur], Bs[cur], trow, tcol, acc);
    if (more) sg_store_tile(As[cur ^ 1], Bs[cur ^ 1], av, bv, ra, ca, rb, cb);
    __syncthreads();
    cur ^= 1;
  }
  sg_write(C, acc, M, N, m0 + trow * SG_TM, n0 + tcol * SG_TN, vc);
}
