/* The launch code behind foxcute.h: argument checks, then each pass's kernels launched with
 * the grid, workspace and ticket logic of the Python host code (foxcute/kernels/<layer>.py),
 * for the sizes compiled in. The kernels themselves are the DSL's exported objects; the
 * generated foxcute_kernels.h declares them and holds each kernel's static configuration
 * (taken from the same Python objects that configure the Python path).
 *
 * Invariants: no pass allocates memory or synchronises (what the library owns, the modules
 * and curiosity's side lanes, foxcute_load makes); every check that needs no CUDA call runs
 * before the first CUDA call, in the order of the status codes; a pass launches only after
 * every check has passed.
 */
#include <math.h> /* isfinite (a macro: no libm) */
#include <stdint.h>

#include "foxcute.h"

/* One column-sum kernel (foxcute.kernels.column_sum.ColumnSum(n)). */
typedef int32_t (*fx_column_sum_fn)(void *G, void *out, void *work, void *tickets, int32_t m,
                                    int32_t num_ctas, cudaStream_t stream);
typedef struct {
    int32_t n, pack, width, slices, rows, unroll, max_m;
    fx_column_sum_fn launch;
} fx_column_sum_t;

/* The Q-denoise kernel, either finish (foxcute.kernels.q_denoise.QDenoiseKernel). */
typedef int32_t (*fx_q_denoise_fn)(void *q, void *q_target, void *W1, void *b1, void *W2, void *b2,
                                   void *dq, void *grads, void *work, void *tickets, int32_t batch,
                                   int32_t num_ctas, int32_t group_size, int32_t num_groups,
                                   float inv_count, cudaStream_t stream);

/* One exported module: the DSL's init (cudaLibraryLoadData of its embedded cubin) and its
 * per-device load, called as the DSL's generated <prefix>_Kernel_Module_Load calls them. */
typedef struct {
    void (*init)(void **);
    void (*load_to_device)(void **);
} fx_module_t;

/* The KAN backward's TF32 kernel, either finish (foxcute.kernels.kan.KanBackwardTf32). */
typedef int32_t (*fx_kan_backward_fn)(void *dy, void *x, void *C, void *Wb, void *dx, void *grads, void *work,
                                      void *tickets, int32_t batch, int32_t num_chunks, int32_t group_size,
                                      int32_t num_groups, cudaStream_t stream);

#include "foxcute_kernels.h"

#define FX_MODULE_COUNT ((int)(sizeof FX_MODULES / sizeof FX_MODULES[0]))
#define FX_TICKET_BYTES(count) (((size_t)(count) * sizeof(int32_t) + 15) / 16 * 16)

static cudaLibrary_t fx_libraries[FX_MODULE_COUNT];
static int fx_loaded;

/* A device's side lane, as the Python path's _arrays.SideLane: a non-blocking stream the
 * curiosity pass forks its column sums onto (after the fork event, recorded on the caller's
 * stream) and joins back from (the join event, recorded on the lane), so that they run beside
 * the weight gradients; inside a graph capture the two become parallel branches. Made by
 * foxcute_load for every visible device (a pass makes nothing), one a device: shared by every
 * call on that device, which is why curiosity calls on one device must not overlap. */
typedef struct {
    cudaStream_t stream;
    cudaEvent_t fork, join;
} fx_lane_t;

static fx_lane_t fx_lanes[FOXCUTE_MAX_DEVICES]; /* fixed: load allocates nothing of ours either */
static int fx_lane_count;                       /* devices 0 .. fx_lane_count - 1 have one */

static int cuda_status(cudaError_t e) { return e == cudaSuccess ? FOXCUTE_OK : FOXCUTE_ERR_CUDA + (int)e; }

/* Loads module i onto every device; FOXCUTE_OK or the first CUDA error. */
static int load_module(int i, int devices) {
    cudaLibrary_t *library = &fx_libraries[i];
    cudaError_t ret = cudaSuccess;
    struct { cudaLibrary_t **library; cudaError_t *ret; } init_args = {&library, &ret};
    FX_MODULES[i].init((void **)&init_args);
    int status = cuda_status(ret);
    for (int32_t device = 0; device < devices && status == FOXCUTE_OK; device++) {
        struct { cudaLibrary_t **library; int32_t *device; cudaError_t *ret; } load_args = {&library, &device, &ret};
        FX_MODULES[i].load_to_device((void **)&load_args);
        status = cuda_status(ret);
    }
    return status;
}

static int unload_modules(int count) {
    int status = FOXCUTE_OK;
    for (int i = 0; i < count; i++) {
        int s = cuda_status(cudaLibraryUnload(fx_libraries[i]));
        if (status == FOXCUTE_OK) status = s;
    }
    return status;
}

/* Makes a lane on the current device; on a failure destroys what it made, so a lane is
 * either whole or absent. */
static int create_lane(fx_lane_t *lane) {
    int status = cuda_status(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
    if (status != FOXCUTE_OK) return status;
    status = cuda_status(cudaEventCreateWithFlags(&lane->fork, cudaEventDisableTiming));
    if (status == FOXCUTE_OK) {
        status = cuda_status(cudaEventCreateWithFlags(&lane->join, cudaEventDisableTiming));
        if (status != FOXCUTE_OK) cudaEventDestroy(lane->fork);
    }
    if (status != FOXCUTE_OK) cudaStreamDestroy(lane->stream);
    return status;
}

/* Destroys lanes 0 .. fx_lane_count - 1 (a handle carries its device: no cudaSetDevice). Work
 * still queued on a lane finishes first (the runtime releases them afterwards). */
static int destroy_lanes(void) {
    int status = FOXCUTE_OK;
    for (int d = 0; d < fx_lane_count; d++) {
        int s[3] = {cuda_status(cudaEventDestroy(fx_lanes[d].join)), cuda_status(cudaEventDestroy(fx_lanes[d].fork)),
                    cuda_status(cudaStreamDestroy(fx_lanes[d].stream))};
        for (int i = 0; i < 3; i++)
            if (status == FOXCUTE_OK) status = s[i];
    }
    fx_lane_count = 0;
    return status;
}

/* One lane for each of `devices` devices; the caller's current device is current again
 * afterwards, even on a failure (then the lanes made so far are destroyed). The current
 * device's lane is made without cudaSetDevice, so a one-device process never switches
 * device (nor replaces a context the caller made current). */
static int create_lanes(int devices) {
    int current = 0, on;
    if (devices > FOXCUTE_MAX_DEVICES) return cuda_status(cudaErrorInvalidDevice); /* header: FOXCUTE_MAX_DEVICES */
    int status = cuda_status(cudaGetDevice(&current));
    on = current;
    while (status == FOXCUTE_OK && fx_lane_count < devices) {
        if (fx_lane_count != on) {
            status = cuda_status(cudaSetDevice(fx_lane_count));
            if (status == FOXCUTE_OK) on = fx_lane_count; /* a failed switch leaves `on` current */
        }
        if (status == FOXCUTE_OK) status = create_lane(&fx_lanes[fx_lane_count]);
        if (status == FOXCUTE_OK) fx_lane_count++;
    }
    if (on != current) {
        int s = cuda_status(cudaSetDevice(current));
        if (status == FOXCUTE_OK) status = s;
    }
    if (status != FOXCUTE_OK) destroy_lanes();
    return status;
}

/* Idempotent; on a failure the modules loaded and the lanes made so far are unloaded and
 * destroyed again. Not thread-safe: call it before other threads use the passes. */
int foxcute_load(void) {
    int devices = 0, loaded = 0;
    if (fx_loaded) return FOXCUTE_OK;
    int status = cuda_status(cudaGetDeviceCount(&devices));
    while (status == FOXCUTE_OK && loaded < FX_MODULE_COUNT) {
        status = load_module(loaded, devices);
        if (status == FOXCUTE_OK) loaded++;
    }
    if (status == FOXCUTE_OK) status = create_lanes(devices);
    if (status != FOXCUTE_OK) {
        unload_modules(loaded);
        return status;
    }
    fx_loaded = 1;
    return status;
}

int foxcute_unload(void) {
    if (!fx_loaded) return FOXCUTE_OK;
    fx_loaded = 0;
    int status = destroy_lanes();
    int s = unload_modules(FX_MODULE_COUNT);
    return status == FOXCUTE_OK ? s : status;
}

const char *foxcute_status_string(int status) {
    switch (status) {
    case FOXCUTE_OK: return "ok";
    case FOXCUTE_ERR_NULL_POINTER: return "null pointer";
    case FOXCUTE_ERR_MISALIGNED: return "pointer not 16-byte aligned";
    case FOXCUTE_ERR_SIZE: return "size not compiled in or out of range";
    case FOXCUTE_ERR_VALUE: return "scalar not finite";
    case FOXCUTE_ERR_NOT_LOADED: return "foxcute_load has not succeeded";
    case FOXCUTE_ERR_WORKSPACE: return "workspace too small";
    default: return status > FOXCUTE_ERR_CUDA ? "CUDA error (status - FOXCUTE_ERR_CUDA)" : "unknown status";
    }
}

/* ---- checks (no CUDA call) ---- */

/* FOXCUTE_ERR_NULL_POINTER if any pointer is NULL, else FOXCUTE_ERR_MISALIGNED if any is not
 * 16-byte aligned, else FOXCUTE_OK. */
static int check_pointers(const void *const *pointers, int count) {
    for (int i = 0; i < count; i++)
        if (pointers[i] == NULL) return FOXCUTE_ERR_NULL_POINTER;
    for (int i = 0; i < count; i++)
        if ((uintptr_t)pointers[i] % FOXCUTE_ALIGN) return FOXCUTE_ERR_MISALIGNED;
    return FOXCUTE_OK;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The current device's multiprocessor count (what the Python path's grids are sized by). */
static int sm_count(int32_t *sms) {
    int device = 0;
    int status = cuda_status(cudaGetDevice(&device));
    if (status == FOXCUTE_OK) status = cuda_status(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));
    return status;
}

/* ---- column sum ---- */

static const fx_column_sum_t *column_sum_kernel(int32_t M, int32_t N) {
    for (size_t i = 0; i < sizeof FX_COLUMN_SUMS / sizeof FX_COLUMN_SUMS[0]; i++)
        if (FX_COLUMN_SUMS[i].n == N) return M >= 1 && M <= FX_COLUMN_SUMS[i].max_m ? &FX_COLUMN_SUMS[i] : NULL;
    return NULL;
}

/* column_sum.grid_size: CTAs along the rows, at most CTAS_PER_SM an SM over the slices. */
static int32_t column_sum_grid(const fx_column_sum_t *k, int32_t M, int32_t sms) {
    int64_t steps = ceil_div(ceil_div(M / k->pack, k->rows), k->unroll);
    int64_t cap = (int64_t)FX_CTAS_PER_SM * sms / k->slices;
    int64_t ctas = steps < cap ? steps : cap;
    return (int32_t)(ctas > 1 ? ctas : 1);
}

/* Tickets (one a column slice), then the CTAs' partial rows and their total. */
static size_t column_sum_bytes(const fx_column_sum_t *k, int32_t num_ctas) {
    return FX_TICKET_BYTES(k->slices) + (size_t)(num_ctas + 1) * k->width * sizeof(float);
}

int foxcute_column_sum_workspace_bytes(int32_t M, int32_t N, size_t *bytes) {
    const fx_column_sum_t *k = column_sum_kernel(M, N);
    int32_t sms = 0;
    if (bytes == NULL) return FOXCUTE_ERR_NULL_POINTER;
    if (k == NULL) return FOXCUTE_ERR_SIZE;
    int status = sm_count(&sms);
    if (status == FOXCUTE_OK) *bytes = column_sum_bytes(k, column_sum_grid(k, M, sms));
    return status;
}

int foxcute_column_sum(const float *G, float *out, int32_t M, int32_t N, void *workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
    const void *pointers[] = {G, out, workspace};
    int status = check_pointers(pointers, 3);
    const fx_column_sum_t *k = column_sum_kernel(M, N);
    int32_t sms = 0;
    if (status != FOXCUTE_OK) return status;
    if (k == NULL) return FOXCUTE_ERR_SIZE;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    if ((status = sm_count(&sms)) != FOXCUTE_OK) return status;
    int32_t num_ctas = column_sum_grid(k, M, sms);
    if (workspace_bytes < column_sum_bytes(k, num_ctas)) return FOXCUTE_ERR_WORKSPACE;
    char *tickets = workspace;
    return cuda_status((cudaError_t)k->launch((void *)G, out, tickets + FX_TICKET_BYTES(k->slices), tickets, M,
                                              num_ctas, stream));
}

/* ---- Q-denoise ---- */

typedef struct {
    int32_t num_ctas, group_size, num_groups;
} q_denoise_grid_t;

/* floor(sqrt(n)) for n >= 0 (math.isqrt), by Newton's method on integers. */
static int64_t isqrt(int64_t n) {
    int64_t x = n, y = (n + 1) / 2;
    while (y < x) {
        x = y;
        y = (x + n / x) / 2;
    }
    return x;
}

/* q_denoise.reduction_grid, and the one-level ("spread") finish where every CTA is resident
 * at once (num_ctas <= sms), as q_denoise.loss_and_grads chooses. */
static q_denoise_grid_t q_denoise_grid(int32_t B, int32_t sms) {
    q_denoise_grid_t g;
    int64_t by_sqrt = isqrt(ceil_div(B, FX_Q_SAMPLES) - 1) + 1;
    int64_t by_groups = ceil_div(ceil_div(B, FX_Q_SAMPLES), FX_Q_MAX_GROUPS);
    g.num_ctas = (int32_t)ceil_div(B, FX_Q_SAMPLES);
    g.group_size = (int32_t)(by_sqrt > by_groups ? by_sqrt : by_groups);
    g.num_groups = (int32_t)ceil_div(g.num_ctas, g.group_size);
    if (g.num_ctas <= sms) {
        g.group_size = g.num_ctas;
        g.num_groups = 0;
    }
    return g;
}

/* Tickets (one a group and the final one), then the CTAs' and the groups' partial rows. */
static size_t q_denoise_bytes(q_denoise_grid_t g) {
    return FX_TICKET_BYTES(g.num_groups + 1) + (size_t)(g.num_ctas + g.num_groups) * FX_Q_PADDED * sizeof(float);
}

static int q_denoise_sizes(int32_t B, int32_t A, int32_t H) {
    int ok = A == FOXCUTE_Q_DENOISE_A && H == FOXCUTE_Q_DENOISE_H && B >= 1 && B <= FOXCUTE_Q_DENOISE_MAX_B;
    return ok ? FOXCUTE_OK : FOXCUTE_ERR_SIZE;
}

int foxcute_q_denoise_workspace_bytes(int32_t B, int32_t A, int32_t H, size_t *bytes) {
    int32_t sms = 0;
    if (bytes == NULL) return FOXCUTE_ERR_NULL_POINTER;
    int status = q_denoise_sizes(B, A, H);
    if (status == FOXCUTE_OK) status = sm_count(&sms);
    if (status == FOXCUTE_OK) *bytes = q_denoise_bytes(q_denoise_grid(B, sms));
    return status;
}

int foxcute_q_denoise_loss_and_grads(const float *q, const float *q_target, const float *W1,
                                     const float *b1, const float *W2, const float *b2, float *dq,
                                     float *grads, int32_t B, int32_t A, int32_t H, void *workspace,
                                     size_t workspace_bytes, cudaStream_t stream) {
    const void *pointers[] = {q, q_target, W1, b1, W2, b2, dq, grads, workspace};
    int status = check_pointers(pointers, 9);
    int32_t sms = 0;
    if (status == FOXCUTE_OK) status = q_denoise_sizes(B, A, H);
    if (status != FOXCUTE_OK) return status;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    if ((status = sm_count(&sms)) != FOXCUTE_OK) return status;
    q_denoise_grid_t g = q_denoise_grid(B, sms);
    if (workspace_bytes < q_denoise_bytes(g)) return FOXCUTE_ERR_WORKSPACE;
    fx_q_denoise_fn launch = g.num_groups == 0 ? fx_q_denoise_spread : fx_q_denoise_two_level;
    char *tickets = workspace;
    float inv_count = (float)(1.0 / ((double)B * A));
    return cuda_status((cudaError_t)launch((void *)q, (void *)q_target, (void *)W1, (void *)b1, (void *)W2,
                                           (void *)b2, dq, grads, tickets + FX_TICKET_BYTES(g.num_groups + 1),
                                           tickets, B, g.num_ctas, g.group_size, g.num_groups, inv_count,
                                           stream));
}

/* ---- risk budget ---- */

int foxcute_risk_budget_forward(const float *h, const float *isv, const float *e, const float *W1,
                                const float *b1, const float *w2, float b2, float *risk, int32_t B,
                                int32_t SH2, int32_t I, int32_t H, cudaStream_t stream) {
    const void *pointers[] = {h, isv, e, W1, b1, w2, risk};
    int status = check_pointers(pointers, 7);
    if (status != FOXCUTE_OK) return status;
    if (SH2 != FOXCUTE_RISK_BUDGET_SH2 || I != FOXCUTE_RISK_BUDGET_I || H != FOXCUTE_RISK_BUDGET_H || B < 1 ||
        B > FOXCUTE_RISK_BUDGET_MAX_B)
        return FOXCUTE_ERR_SIZE;
    if (!isfinite(b2)) return FOXCUTE_ERR_VALUE;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    return cuda_status((cudaError_t)fx_risk_budget((void *)h, (void *)isv, (void *)e, (void *)W1, (void *)b1,
                                                   (void *)w2, risk, B, b2, stream));
}

/* ---- KAN ---- */

static int kan_sizes(int32_t B, int32_t I, int32_t O, int32_t G) {
    int ok = I == FOXCUTE_KAN_I && O == FOXCUTE_KAN_O && G == FOXCUTE_KAN_G && B >= 1 && B <= FOXCUTE_KAN_MAX_B;
    return ok ? FOXCUTE_OK : FOXCUTE_ERR_SIZE;
}

int foxcute_kan_forward(const float *x, const float *C, const float *Wb, float *y, int32_t B, int32_t I,
                        int32_t O, int32_t G, cudaStream_t stream) {
    const void *pointers[] = {x, C, Wb, y};
    int status = check_pointers(pointers, 4);
    if (status == FOXCUTE_OK) status = kan_sizes(B, I, O, G);
    if (status != FOXCUTE_OK) return status;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    return cuda_status((cudaError_t)fx_kan_forward((void *)x, (void *)C, (void *)Wb, y, B, stream));
}

#if FX_KAN_TF32
typedef struct {
    int32_t chunks, group_size, groups;
} kan_grid_t;

/* kan.reduction_grid, and the one-level finish where chunks x blocks <= SMs (kan.spreads),
 * as kan.backward chooses. */
static kan_grid_t kan_grid(int32_t B, int32_t sms) {
    kan_grid_t g;
    int64_t max_groups = FX_KAN_MAX_TICKETS / FX_KAN_BLOCKS - 1;
    g.chunks = (int32_t)ceil_div(B, FX_KAN_ROWS);
    int64_t by_sqrt = isqrt(g.chunks - 1) + 1, by_groups = ceil_div(g.chunks, max_groups);
    g.group_size = (int32_t)(by_sqrt > by_groups ? by_sqrt : by_groups);
    g.groups = (int32_t)ceil_div(g.chunks, g.group_size);
    if ((int64_t)g.chunks * FX_KAN_BLOCKS <= sms) {
        g.group_size = g.chunks;
        g.groups = 0;
    }
    return g;
}

/* Tickets (one a group and block, and each block's final one), then the blocks' chunk and
 * group rows. */
static size_t kan_bytes(int32_t B, int32_t sms) {
    kan_grid_t g = kan_grid(B, sms);
    return FX_TICKET_BYTES(FX_KAN_BLOCKS * (g.groups + 1)) +
           (size_t)FX_KAN_BLOCKS * (g.chunks + g.groups) * FX_KAN_ROW_LEN * sizeof(float);
}

static int kan_backward_launch(const float *dy, const float *x, const float *C, const float *Wb, float *dx,
                               float *grads, int32_t B, char *workspace, int32_t sms, cudaStream_t stream) {
    kan_grid_t g = kan_grid(B, sms);
    fx_kan_backward_fn launch = g.groups == 0 ? fx_kan_backward_spread : fx_kan_backward_two_level;
    return cuda_status((cudaError_t)launch((void *)dy, (void *)x, (void *)C, (void *)Wb, dx, grads,
                                           workspace + FX_TICKET_BYTES(FX_KAN_BLOCKS * (g.groups + 1)), workspace,
                                           B, g.chunks, g.group_size, g.groups, stream));
}
#else
/* The fp32 backward's per-CTA partial rows (one a FX_KAN_ROWS rows); no tickets. */
static size_t kan_bytes(int32_t B, int32_t sms) {
    (void)sms;
    return (size_t)ceil_div(B, FX_KAN_ROWS) * FX_KAN_PARTIAL_LEN * sizeof(float);
}

/* The backward kernel, then the grad reduce of its partials (a PDL dependent of it). */
static int kan_backward_launch(const float *dy, const float *x, const float *C, const float *Wb, float *dx,
                               float *grads, int32_t B, char *workspace, int32_t sms, cudaStream_t stream) {
    (void)sms;
    int status = cuda_status((cudaError_t)fx_kan_backward_fp32((void *)dy, (void *)x, (void *)C, (void *)Wb, dx,
                                                               workspace, B, stream));
    if (status != FOXCUTE_OK) return status;
    return cuda_status((cudaError_t)fx_kan_grad_reduce(workspace, grads, (int32_t)ceil_div(B, FX_KAN_ROWS), stream));
}
#endif

int foxcute_kan_backward_workspace_bytes(int32_t B, int32_t I, int32_t O, int32_t G, size_t *bytes) {
    int32_t sms = 0;
    if (bytes == NULL) return FOXCUTE_ERR_NULL_POINTER;
    int status = kan_sizes(B, I, O, G);
    if (status == FOXCUTE_OK) status = sm_count(&sms);
    if (status == FOXCUTE_OK) *bytes = kan_bytes(B, sms);
    return status;
}

int foxcute_kan_backward(const float *dy, const float *x, const float *C, const float *Wb, float *dx,
                         float *grads, int32_t B, int32_t I, int32_t O, int32_t G, void *workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    const void *pointers[] = {dy, x, C, Wb, dx, grads, workspace};
    int status = check_pointers(pointers, 7);
    int32_t sms = 0;
    if (status == FOXCUTE_OK) status = kan_sizes(B, I, O, G);
    if (status != FOXCUTE_OK) return status;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    if ((status = sm_count(&sms)) != FOXCUTE_OK) return status;
    if (workspace_bytes < kan_bytes(B, sms)) return FOXCUTE_ERR_WORKSPACE;
    return kan_backward_launch(dy, x, C, Wb, dx, grads, B, workspace, sms, stream);
}

/* ---- curiosity ---- */

#define FX_FLOATS(count) (((size_t)(count) + 3) / 4 * 4) /* a region of floats, 16-byte multiple */

/* The pass's grids and the workspace regions (offsets in bytes), all fixed by B and the SMs. */
typedef struct {
    int32_t num_ctas, kp;                        /* row pass CTAs; K-major rows (tf32) */
    int32_t sum_ctas;                            /* ColumnSum(width)'s grid over num_ctas rows */
    int32_t wg_ctas, wg_rows, wg_splits, wg_per_split; /* the weight gradients' grid */
    size_t prep, hid, dpred, dz, partials, sum_work, wg_work, bytes;
} cu_plan_t;

static cu_plan_t cu_plan(int32_t B, int32_t sms) {
    const int64_t F = FOXCUTE_CURIOSITY_F, H = FOXCUTE_CURIOSITY_H;
    cu_plan_t p = {0};
    p.num_ctas = (int32_t)ceil_div(B, FX_CU_BM);
    p.kp = p.num_ctas * FX_CU_BM;
    p.sum_ctas = column_sum_grid(&FX_CU_SUMS, p.num_ctas, sms);
#if FX_CU_TF32
    int64_t rows = p.kp; /* hid, dpred, dz K-major [n, Kp] */
    int64_t num_kb = p.kp / FX_CU_KB, want = sms / FX_CU_TILES; /* gemm.kmajor_split */
    want = want < 1 ? 1 : (want < num_kb ? want : num_kb);
    p.wg_per_split = (int32_t)ceil_div(num_kb, want);
    p.wg_splits = (int32_t)ceil_div(num_kb, p.wg_per_split);
    size_t wg_floats = (size_t)FX_CU_TILES * p.wg_splits * FX_CU_TILE_FLOATS;
#else
    int64_t rows = B; /* hid, dpred, dz row-major [B, n] */
    int64_t want = sms / FX_CU_TILES, steps = ceil_div(B, FX_CU_CHUNK); /* gemm.weight_grad_grid */
    want = want < 1 ? 1 : want;
    p.wg_rows = (int32_t)(ceil_div(steps, want < steps ? want : steps) * FX_CU_CHUNK);
    p.wg_ctas = (int32_t)ceil_div(B, p.wg_rows);
    size_t wg_floats = (size_t)p.wg_ctas * FX_CU_WORK_PER_CTA;
#endif
    size_t at = FX_TICKET_BYTES(FX_CU_TILES) + FX_TICKET_BYTES(FX_CU_SUMS.slices); /* both ticket runs first */
    p.prep = at, at += FX_FLOATS(FX_CU_PREP_FLOATS) * sizeof(float);
    p.hid = at, at += FX_FLOATS(H * rows) * sizeof(float);
    p.dpred = at, at += FX_FLOATS(F * rows) * sizeof(float);
    p.dz = at, at += FX_FLOATS(H * rows) * sizeof(float);
    p.partials = at, at += FX_FLOATS((int64_t)p.num_ctas * FOXCUTE_CURIOSITY_SUMS) * sizeof(float);
    p.sum_work = at, at += FX_FLOATS((int64_t)(p.sum_ctas + 1) * FX_CU_SUMS.width) * sizeof(float);
    p.wg_work = at, at += FX_FLOATS(wg_floats) * sizeof(float);
    p.bytes = at;
    return p;
}

static int cu_sizes(int32_t B, int32_t F, int32_t A, int32_t H) {
    int ok = F == FOXCUTE_CURIOSITY_F && A == FOXCUTE_CURIOSITY_A && H == FOXCUTE_CURIOSITY_H && B >= 1 &&
             B <= FOXCUTE_CURIOSITY_MAX_B;
    return ok ? FOXCUTE_OK : FOXCUTE_ERR_SIZE;
}

int foxcute_curiosity_workspace_bytes(int32_t B, int32_t F, int32_t A, int32_t H, size_t *bytes) {
    int32_t sms = 0;
    if (bytes == NULL) return FOXCUTE_ERR_NULL_POINTER;
    int status = cu_sizes(B, F, A, H);
    if (status == FOXCUTE_OK) status = sm_count(&sms);
    if (status == FOXCUTE_OK) *bytes = cu_plan(B, sms).bytes;
    return status;
}

/* dW2 = dpred^T hid and dW1[:, :F] = dz^T s, one launch (curiosity.forward_backward's
 * weight_gradients). */
static int cu_weight_grads(const cu_plan_t *p, char *ws, const float *s, float *dW1, float *dW2, int32_t B,
                           cudaStream_t stream) {
    const int32_t F = FOXCUTE_CURIOSITY_F, H = FOXCUTE_CURIOSITY_H, A = FOXCUTE_CURIOSITY_A;
#if FX_CU_TF32
    return cuda_status((cudaError_t)fx_curiosity_weight_grads(ws + p->dpred, ws + p->hid, dW2, F, H, H, (void *)s,
                                                              ws + p->dz, dW1, F, H, F + A, ws + p->wg_work, ws, B,
                                                              p->kp / 4, p->wg_per_split, p->wg_splits, stream));
#else
    return cuda_status((cudaError_t)fx_curiosity_weight_grads(
        ws + p->dpred, ws + p->hid, dW2, dW2, F / FX_CU_VEC_F, H / FX_CU_VEC_H, H, ws + p->dz, (void *)s, dW1, dW1,
        H / FX_CU_VEC_H, F / FX_CU_VEC_F, F + A, ws + p->wg_work, ws, B, p->wg_rows, p->wg_ctas, stream));
#endif
}

/* WeightPrep and the row pass on `stream`; then, as curiosity.forward_backward's side lane,
 * a fork: the column sums of the row pass's partials and the copy of dW1's action columns out
 * of them on the current device's lane, beside the weight gradients on `stream`, which waits
 * for the lane at the end. The two branches share nothing they write: the sums read the
 * partials and write sum_work, their own tickets (the second ticket run) and sums, then
 * dW1[:, F:]; the weight gradients read hid, dpred, dz and s and write wg_work, the first
 * ticket run, dW2 and dW1[:, :F]. Event record and wait are legal inside a capture (any
 * mode), where the lane joins the capture and the graph gets two branches. The lane and its
 * events are the device's, shared by every call: calls on one device must not overlap (two
 * threads' forks would cross), nor may one run on another stream while a capture holding one
 * is open (the lane stays in that capture until it ends). */
int foxcute_curiosity_forward_backward(const float *s, const int32_t *a, const float *s_next, const float *W1,
                                       const float *b1, const float *W2, const float *b2, float *r, float *ds,
                                       float *dW1, float *dW2, float *sums, int32_t B, int32_t F, int32_t A,
                                       int32_t H, void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const void *pointers[] = {s, a, s_next, W1, b1, W2, b2, r, ds, dW1, dW2, sums, workspace};
    int status = check_pointers(pointers, 13);
    int32_t sms = 0;
    int device = 0;
    if (status == FOXCUTE_OK) status = cu_sizes(B, F, A, H);
    if (status != FOXCUTE_OK) return status;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    if ((status = sm_count(&sms)) != FOXCUTE_OK) return status;
    cu_plan_t p = cu_plan(B, sms);
    if (workspace_bytes < p.bytes) return FOXCUTE_ERR_WORKSPACE;
    if ((status = cuda_status(cudaGetDevice(&device))) != FOXCUTE_OK) return status;
    if (device >= fx_lane_count) return cuda_status(cudaErrorInvalidDevice); /* not seen by foxcute_load */
    const fx_lane_t *lane = &fx_lanes[device];
    char *ws = workspace, *sum_tickets = ws + FX_TICKET_BYTES(FX_CU_TILES);
    status = cuda_status((cudaError_t)fx_curiosity_weight_prep((void *)W1, (void *)W2, ws + p.prep, stream));
    if (status == FOXCUTE_OK)
        status = cuda_status((cudaError_t)fx_curiosity_row_pass(
            (void *)s, (void *)a, (void *)s_next, (void *)W1, ws + p.prep, (void *)b1, (void *)b2, r, ds, ws + p.hid,
            ws + p.dpred, ws + p.dz, ws + p.partials, B, p.num_ctas, (float)(1.0 / ((double)F * B)), stream));
    if (status == FOXCUTE_OK) status = cuda_status(cudaEventRecord(lane->fork, stream));
    if (status == FOXCUTE_OK) status = cuda_status(cudaStreamWaitEvent(lane->stream, lane->fork, 0));
    if (status != FOXCUTE_OK) return status;
    /* forked: from here the lane is joined back whatever fails, so no capture is left with an
     * unjoined branch and the caller's later work on `stream` still follows the lane's */
    status = cuda_status((cudaError_t)FX_CU_SUMS.launch(ws + p.partials, sums, ws + p.sum_work, sum_tickets,
                                                        p.num_ctas, p.sum_ctas, lane->stream));
    if (status == FOXCUTE_OK) /* dW1[:, F:] = the action columns' sums [H, A] */
        status = cuda_status(cudaMemcpy2DAsync(dW1 + F, (size_t)(F + A) * sizeof(float), sums + FOXCUTE_CURIOSITY_DW1A,
                                               (size_t)A * sizeof(float), (size_t)A * sizeof(float), (size_t)H,
                                               cudaMemcpyDeviceToDevice, lane->stream));
    int joined = cuda_status(cudaEventRecord(lane->join, lane->stream));
    if (status == FOXCUTE_OK) status = cu_weight_grads(&p, ws, s, dW1, dW2, B, stream);
    if (joined == FOXCUTE_OK) joined = cuda_status(cudaStreamWaitEvent(stream, lane->join, 0));
    return status == FOXCUTE_OK ? joined : status;
}

/* ---- Mamba2 (fused) ---- */

static int m2_sizes(int32_t B, int32_t K, int32_t SH2, int32_t D) {
    int ok = K == FOXCUTE_MAMBA2_K && SH2 == FOXCUTE_MAMBA2_SH2 && D == FOXCUTE_MAMBA2_D && B >= 1 &&
             B <= FOXCUTE_MAMBA2_MAX_B;
    return ok ? FOXCUTE_OK : FOXCUTE_ERR_SIZE;
}

/* mamba2._persistent_ctas: a CTA a tile of `samples` samples, at most ctas_per_sm an SM. */
static int32_t m2_ctas(int32_t B, int32_t samples, int32_t ctas_per_sm, int32_t sms) {
    int64_t tiles = ceil_div(B, samples), cap = (int64_t)sms * ctas_per_sm;
    int64_t ctas = tiles < cap ? tiles : cap;
    return (int32_t)(ctas > 1 ? ctas : 1);
}

int foxcute_mamba2_forward(const float *h_hist, const float *h, const float *W_A, const float *W_B,
                           const float *W_C, const float *w, float sigma, float *out, int32_t B, int32_t K,
                           int32_t SH2, int32_t D, cudaStream_t stream) {
    const void *pointers[] = {h_hist, h, W_A, W_B, W_C, w, out};
    int status = check_pointers(pointers, 7);
    int32_t sms = 0;
    if (status == FOXCUTE_OK) status = m2_sizes(B, K, SH2, D);
    if (status != FOXCUTE_OK) return status;
    if (!isfinite(sigma)) return FOXCUTE_ERR_VALUE;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    if ((status = sm_count(&sms)) != FOXCUTE_OK) return status;
    return cuda_status((cudaError_t)fx_mamba2_forward((void *)h_hist, (void *)h, (void *)W_A, (void *)W_B, (void *)W_C,
                                                      (void *)w, out, sigma, B,
                                                      m2_ctas(B, FX_M2F_SAMPLES, FX_M2F_CTAS_PER_SM, sms), stream));
}

/* Tickets of the partials' column sum, the partials [ctas, width], the column sum's rows. */
typedef struct {
    int32_t ctas, sum_ctas;
    size_t partials, sum_work, bytes;
} m2_plan_t;

static m2_plan_t m2_plan(int32_t B, int32_t sms) {
    m2_plan_t p;
    p.ctas = m2_ctas(B, FX_M2B_SAMPLES, FX_M2B_CTAS_PER_SM, sms);
    p.sum_ctas = column_sum_grid(&FX_M2B_SUMS, p.ctas, sms);
    p.partials = FX_TICKET_BYTES(FX_M2B_SUMS.slices);
    p.sum_work = p.partials + (size_t)p.ctas * FOXCUTE_MAMBA2_GRADS * sizeof(float);
    p.bytes = p.sum_work + (size_t)(p.sum_ctas + 1) * FX_M2B_SUMS.width * sizeof(float);
    return p;
}

int foxcute_mamba2_backward_workspace_bytes(int32_t B, int32_t K, int32_t SH2, int32_t D, size_t *bytes) {
    int32_t sms = 0;
    if (bytes == NULL) return FOXCUTE_ERR_NULL_POINTER;
    int status = m2_sizes(B, K, SH2, D);
    if (status == FOXCUTE_OK) status = sm_count(&sms);
    if (status == FOXCUTE_OK) *bytes = m2_plan(B, sms).bytes;
    return status;
}

/* FusedBackward, then the column sum of its partials as its programmatic dependent (as
 * mamba2.backward launches them). */
int foxcute_mamba2_backward(const float *dout, const float *h_hist, const float *h, const float *W_A,
                            const float *W_B, const float *W_C, const float *w, float sigma, float *dh_hist,
                            float *dh, float *grads, int32_t B, int32_t K, int32_t SH2, int32_t D,
                            void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const void *pointers[] = {dout, h_hist, h, W_A, W_B, W_C, w, dh_hist, dh, grads, workspace};
    int status = check_pointers(pointers, 11);
    int32_t sms = 0;
    if (status == FOXCUTE_OK) status = m2_sizes(B, K, SH2, D);
    if (status != FOXCUTE_OK) return status;
    if (!isfinite(sigma)) return FOXCUTE_ERR_VALUE;
    if (!fx_loaded) return FOXCUTE_ERR_NOT_LOADED;
    if ((status = sm_count(&sms)) != FOXCUTE_OK) return status;
    m2_plan_t p = m2_plan(B, sms);
    if (workspace_bytes < p.bytes) return FOXCUTE_ERR_WORKSPACE;
    char *ws = workspace;
    status = cuda_status((cudaError_t)fx_mamba2_backward((void *)dout, (void *)h_hist, (void *)h, (void *)W_A,
                                                         (void *)W_B, (void *)W_C, (void *)w, ws + p.partials,
                                                         dh_hist, dh, sigma, B, p.ctas, stream));
    if (status == FOXCUTE_OK)
        status = cuda_status((cudaError_t)FX_M2B_SUMS.launch(ws + p.partials, grads, ws + p.sum_work, ws, p.ctas,
                                                             p.sum_ctas, stream));
    return status;
}
