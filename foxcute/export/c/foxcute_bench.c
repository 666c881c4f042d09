/* foxcute_bench: the GPU time of every pass of an exported foxcute library, and of the
 * training step (docs/layers.md section 7) as a chain of its C calls, timed as foxcute's
 * Python side times its kernels (foxcute.lab.timing.bench): one call captured in a CUDA graph
 * on a non-default stream, the graph replayed CALLS_PER_REP times between two CUDA events,
 * REPS such samples after WARMUP plain calls (before the capture) and WARMUP replays.
 * foxcute.lab.c_export builds it against the export (toolchain.compile_program) and runs it.
 *
 *   foxcute_bench B Q H_IQN WARMUP REPS CALLS_PER_REP
 *
 * B the batch; the IQN column sums run over B*Q rows of A (= FOXCUTE_CURIOSITY_A, the step's
 * actions) and of H_IQN columns. Output, one JSON line a timed graph, in the step's order:
 *   {"pass": "<C function without foxcute_>", "N": <column sums only>, "B": B, "samples_us": [...]}
 * the samples in microseconds per call; the last line's pass is "step": the step's calls
 * (Mamba2 forward, curiosity on its output, the risk head on that output and curiosity's r,
 * Q-denoise, the two IQN column sums, KAN backward, Mamba2 backward) in one graph on one stream
 * (curiosity's column sums a branch of their own on the library's side lane).
 * Exit 0 when every CUDA call and every foxcute call succeeded and every replay rewrote the
 * outputs; else a message on stderr and exit 1 (2 for bad arguments).
 *
 * Before a graph is timed its outputs are set to NaN and one replay must leave them finite
 * (as timing.check_graph_replay: a capture that launched nothing replays in no time).
 * Inputs are uniform random (weights scaled by 1/sqrt(fan-in)); the values matter to the
 * check only (finite outputs), not to the time. Every call site has its own workspace, sized
 * by its query and zeroed once: tickets of one pass's layout are another's partial sums.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foxcute.h"

static void fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("foxcute_bench: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

#define CUDA(call)                                                                          \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) fail("%s: %s (line %d)", #call, cudaGetErrorString(e_), __LINE__); \
    } while (0)

static void check_status(const char *what, int status) {
    if (status != FOXCUTE_OK) fail("%s: status %d (%s)", what, status, foxcute_status_string(status));
}

/* ---- device buffers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static float uniform(void) { /* xorshift64: [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / (float)(1 << 23) - 1.0f;
}

static void *device_bytes(size_t bytes) {
    void *p = NULL;
    CUDA(cudaMalloc(&p, bytes));
    CUDA(cudaMemset(p, 0, bytes));
    return p;
}

/* count floats, zero (outputs: finite before anything writes them). */
static float *zeros(size_t count) { return device_bytes(count * sizeof(float)); }

/* count floats uniform in [-scale, scale). */
static float *randoms(size_t count, float scale) {
    float *host = malloc(count * sizeof(float)), *device = zeros(count);
    if (host == NULL) fail("out of host memory");
    for (size_t i = 0; i < count; i++) host[i] = scale * uniform();
    CUDA(cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
    return device;
}

/* 1/sqrt(n), n >= 1, by Newton's iteration for sqrt(n) from n (no libm: the link line has none). */
static float inverse_sqrt(size_t n) {
    double root = (double)n;
    for (int i = 0; i < 64; i++) root = 0.5 * (root + (double)n / root);
    return (float)(1.0 / root);
}

static float *weights(size_t rows, size_t fan_in) { return randoms(rows * fan_in, inverse_sqrt(fan_in)); }

typedef struct {
    void *p;
    size_t bytes;
} workspace_t;

/* The workspace of one call site: `status` is its query's, which wrote *bytes (read here, in
 * the body: an argument `bytes` could be read before the query in the same call ran). */
static workspace_t workspace(const char *what, int status, const size_t *bytes) {
    check_status(what, status);
    workspace_t ws = {device_bytes(*bytes), *bytes}; /* zeroed once, as foxcute.h asks */
    return ws;
}

/* Every buffer of the step (and of the KAN forward, timed alone); names as in foxcute.h. */
typedef struct {
    int32_t B, Q, H_iqn;
    float *h_hist, *h, *W_A, *W_B, *W_C, *w, sigma, *out, *dout, *dh_hist, *dh, *m2_grads; /* Mamba2 */
    int32_t *a;
    float *s_next, *cW1, *cb1, *cW2, *cb2, *r, *ds, *dW1, *dW2, *c_sums;  /* curiosity, s = out */
    float *isv, *rW1, *rb1, *rw2, rb2, *risk;                            /* risk head, h = out, e = r */
    float *q, *q_target, *qW1, *qb1, *qW2, *qb2, *dq, *q_grads;           /* Q-denoise */
    float *head_grad, *hidden_grad, *head_sum, *hidden_sum;               /* IQN bias gradients */
    float *dy, *x, *C, *Wb, *y, *dx, *kan_grads;                          /* KAN */
    workspace_t ws_curiosity, ws_q, ws_head, ws_hidden, ws_kan, ws_m2b;
} bench_t;

static void allocate(bench_t *b) {
    const size_t B = b->B, K = FOXCUTE_MAMBA2_K, SH2 = FOXCUTE_MAMBA2_SH2, D = FOXCUTE_MAMBA2_D;
    const size_t F = FOXCUTE_CURIOSITY_F, A = FOXCUTE_CURIOSITY_A, HC = FOXCUTE_CURIOSITY_H;
    const size_t I = FOXCUTE_RISK_BUDGET_I, HR = FOXCUTE_RISK_BUDGET_H;
    const size_t AQ = FOXCUTE_Q_DENOISE_A, HQ = FOXCUTE_Q_DENOISE_H;
    const size_t IK = FOXCUTE_KAN_I, OK = FOXCUTE_KAN_O, GK = FOXCUTE_KAN_G;
    const size_t M = (size_t)b->B * b->Q;
    if (F != SH2 || FOXCUTE_RISK_BUDGET_SH2 != SH2)
        fail("the step feeds Mamba2's output [B, SH2] to curiosity and the risk head: compiled F = %zu, risk SH2 = %d, "
             "Mamba2 SH2 = %zu differ", F, FOXCUTE_RISK_BUDGET_SH2, SH2);
    if (M * (size_t)(b->H_iqn > (int32_t)A ? b->H_iqn : (int32_t)A) >= ((size_t)1 << 31))
        fail("B*Q*N must be below 2^31 (one column-sum launch)");

    b->h_hist = randoms(B * K * SH2, 1.0f), b->h = randoms(B * SH2, 1.0f);
    b->W_A = weights(SH2, D), b->W_B = weights(SH2, D), b->W_C = weights(SH2, D);
    b->w = randoms(SH2, 1.0f), b->sigma = 0.9f;
    b->out = zeros(B * SH2), b->dout = randoms(B * SH2, 1.0f);
    b->dh_hist = zeros(B * K * SH2), b->dh = zeros(B * SH2), b->m2_grads = zeros(FOXCUTE_MAMBA2_GRADS);

    int32_t *actions = malloc(B * sizeof(int32_t));
    if (actions == NULL) fail("out of host memory");
    for (size_t i = 0; i < B; i++) actions[i] = (int32_t)(i % A); /* in 0..A-1: foxcute does not check them */
    b->a = device_bytes(B * sizeof(int32_t));
    CUDA(cudaMemcpy(b->a, actions, B * sizeof(int32_t), cudaMemcpyHostToDevice));
    free(actions);
    b->s_next = randoms(B * F, 1.0f), b->cW1 = weights(HC, F + A), b->cb1 = randoms(HC, 0.1f);
    b->cW2 = weights(F, HC), b->cb2 = randoms(F, 0.1f);
    b->r = zeros(B), b->ds = zeros(B * F), b->dW1 = zeros(HC * (F + A)), b->dW2 = zeros(F * HC);
    b->c_sums = zeros(FOXCUTE_CURIOSITY_SUMS);

    b->isv = randoms(I, 1.0f), b->rW1 = weights(HR, SH2 + I + 1), b->rb1 = randoms(HR, 0.1f);
    b->rw2 = weights(1, HR), b->rb2 = 0.1f, b->risk = zeros(B);

    b->q = randoms(B * AQ, 1.0f), b->q_target = randoms(B * AQ, 1.0f), b->qW1 = weights(HQ, AQ);
    b->qb1 = randoms(HQ, 0.1f), b->qW2 = weights(AQ, HQ), b->qb2 = randoms(AQ, 0.1f);
    b->dq = zeros(B * AQ), b->q_grads = zeros(FOXCUTE_Q_DENOISE_GRADS);

    b->head_grad = randoms(M * A, 1.0f), b->hidden_grad = randoms(M * b->H_iqn, 1.0f);
    b->head_sum = zeros(A), b->hidden_sum = zeros(b->H_iqn);

    b->dy = randoms(B * OK, 1.0f), b->x = randoms(B * IK, 1.0f), b->C = weights(OK, IK * GK), b->Wb = weights(OK, IK);
    b->y = zeros(B * OK), b->dx = zeros(B * IK), b->kan_grads = zeros(FOXCUTE_KAN_GRADS);

    size_t bytes = 0;
    b->ws_curiosity = workspace("curiosity workspace query",
                                foxcute_curiosity_workspace_bytes(b->B, (int32_t)F, (int32_t)A, (int32_t)HC, &bytes), &bytes);
    b->ws_q = workspace("q_denoise workspace query", foxcute_q_denoise_workspace_bytes(b->B, (int32_t)AQ, (int32_t)HQ, &bytes),
                        &bytes);
    b->ws_head = workspace("column_sum workspace query (N = A)",
                           foxcute_column_sum_workspace_bytes((int32_t)M, (int32_t)A, &bytes), &bytes);
    b->ws_hidden = workspace("column_sum workspace query (N = H_iqn)",
                             foxcute_column_sum_workspace_bytes((int32_t)M, b->H_iqn, &bytes), &bytes);
    b->ws_kan = workspace("kan_backward workspace query",
                          foxcute_kan_backward_workspace_bytes(b->B, (int32_t)IK, (int32_t)OK, (int32_t)GK, &bytes), &bytes);
    b->ws_m2b = workspace("mamba2_backward workspace query",
                          foxcute_mamba2_backward_workspace_bytes(b->B, (int32_t)K, (int32_t)SH2, (int32_t)D, &bytes), &bytes);
}

/* ---- the passes, each one call on stream s; a foxcute status ---- */

static int mamba2_forward(const bench_t *b, cudaStream_t s) {
    return foxcute_mamba2_forward(b->h_hist, b->h, b->W_A, b->W_B, b->W_C, b->w, b->sigma, b->out, b->B,
                                  FOXCUTE_MAMBA2_K, FOXCUTE_MAMBA2_SH2, FOXCUTE_MAMBA2_D, s);
}

static int curiosity(const bench_t *b, cudaStream_t s) {
    return foxcute_curiosity_forward_backward(b->out, b->a, b->s_next, b->cW1, b->cb1, b->cW2, b->cb2, b->r, b->ds,
                                              b->dW1, b->dW2, b->c_sums, b->B, FOXCUTE_CURIOSITY_F, FOXCUTE_CURIOSITY_A,
                                              FOXCUTE_CURIOSITY_H, b->ws_curiosity.p, b->ws_curiosity.bytes, s);
}

static int risk_budget(const bench_t *b, cudaStream_t s) {
    return foxcute_risk_budget_forward(b->out, b->isv, b->r, b->rW1, b->rb1, b->rw2, b->rb2, b->risk, b->B,
                                       FOXCUTE_RISK_BUDGET_SH2, FOXCUTE_RISK_BUDGET_I, FOXCUTE_RISK_BUDGET_H, s);
}

static int q_denoise(const bench_t *b, cudaStream_t s) {
    return foxcute_q_denoise_loss_and_grads(b->q, b->q_target, b->qW1, b->qb1, b->qW2, b->qb2, b->dq, b->q_grads, b->B,
                                            FOXCUTE_Q_DENOISE_A, FOXCUTE_Q_DENOISE_H, b->ws_q.p, b->ws_q.bytes, s);
}

static int column_sum_head(const bench_t *b, cudaStream_t s) {
    return foxcute_column_sum(b->head_grad, b->head_sum, b->B * b->Q, FOXCUTE_CURIOSITY_A, b->ws_head.p,
                              b->ws_head.bytes, s);
}

static int column_sum_hidden(const bench_t *b, cudaStream_t s) {
    return foxcute_column_sum(b->hidden_grad, b->hidden_sum, b->B * b->Q, b->H_iqn, b->ws_hidden.p,
                              b->ws_hidden.bytes, s);
}

static int kan_forward(const bench_t *b, cudaStream_t s) {
    return foxcute_kan_forward(b->x, b->C, b->Wb, b->y, b->B, FOXCUTE_KAN_I, FOXCUTE_KAN_O, FOXCUTE_KAN_G, s);
}

static int kan_backward(const bench_t *b, cudaStream_t s) {
    return foxcute_kan_backward(b->dy, b->x, b->C, b->Wb, b->dx, b->kan_grads, b->B, FOXCUTE_KAN_I, FOXCUTE_KAN_O,
                                FOXCUTE_KAN_G, b->ws_kan.p, b->ws_kan.bytes, s);
}

static int mamba2_backward(const bench_t *b, cudaStream_t s) {
    return foxcute_mamba2_backward(b->dout, b->h_hist, b->h, b->W_A, b->W_B, b->W_C, b->w, b->sigma, b->dh_hist, b->dh,
                                   b->m2_grads, b->B, FOXCUTE_MAMBA2_K, FOXCUTE_MAMBA2_SH2, FOXCUTE_MAMBA2_D,
                                   b->ws_m2b.p, b->ws_m2b.bytes, s);
}

typedef int (*launch_fn)(const bench_t *, cudaStream_t);

/* docs/layers.md section 7's order. */
static const launch_fn STEP[] = {mamba2_forward, curiosity, risk_budget, q_denoise, column_sum_head,
                                 column_sum_hidden, kan_backward, mamba2_backward};
#define STEP_CALLS ((int)(sizeof STEP / sizeof STEP[0]))

static int step(const bench_t *b, cudaStream_t s) {
    for (int i = 0; i < STEP_CALLS; i++) {
        int status = STEP[i](b, s);
        if (status != FOXCUTE_OK) return status;
    }
    return FOXCUTE_OK;
}

/* ---- timing ---- */

#define MAX_SPANS 12

typedef struct {
    float *p;
    size_t count;
} span_t;

/* A timed graph: its name (and N for a column sum), the call captured, and the outputs
 * (whole, or the written sections of a packed gradient) the replay check poisons. */
typedef struct {
    const char *name;
    int32_t N;
    launch_fn launch;
    span_t outputs[MAX_SPANS];
} pass_t;

/* Set every output span to NaN, replay once, demand every value finite again. */
static void check_replay(const pass_t *pass, cudaGraphExec_t exec, cudaStream_t s) {
    for (int i = 0; i < MAX_SPANS && pass->outputs[i].p; i++)
        CUDA(cudaMemsetAsync(pass->outputs[i].p, 0xff, pass->outputs[i].count * sizeof(float), s)); /* NaN bits */
    CUDA(cudaGraphLaunch(exec, s));
    CUDA(cudaStreamSynchronize(s));
    for (int i = 0; i < MAX_SPANS && pass->outputs[i].p; i++) {
        size_t n = pass->outputs[i].count;
        float *host = malloc(n * sizeof(float));
        if (host == NULL) fail("out of host memory");
        CUDA(cudaMemcpy(host, pass->outputs[i].p, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < n; j++)
            if (!isfinite(host[j]))
                fail("%s: output %d [%zu] is not finite after a replay of the captured graph (nothing launched "
                     "in the capture, or a non-finite result)", pass->name, i, j);
        free(host);
    }
}

static void time_pass(const bench_t *b, const pass_t *pass, cudaStream_t s, int warmup, int reps, int calls_per_rep) {
    char what[96];
    snprintf(what, sizeof what, "%s (N=%d)", pass->name, pass->N);
    for (int i = 0; i < warmup; i++) check_status(what, pass->launch(b, s));
    CUDA(cudaStreamSynchronize(s));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    /* relaxed, as timing's cupy capture: no other thread's API call can break the capture;
     * the launches on s are what the graph holds, and check_replay proves there are some */
    CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    int status = pass->launch(b, s);
    cudaError_t ended = cudaStreamEndCapture(s, &graph);
    check_status(what, status);
    CUDA(ended);
    CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CUDA(cudaGraphUpload(exec, s));
    check_replay(pass, exec, s);
    for (int i = 0; i < warmup; i++) CUDA(cudaGraphLaunch(exec, s));

    cudaEvent_t start, end;
    CUDA(cudaEventCreate(&start));
    CUDA(cudaEventCreate(&end));
    printf("{\"pass\": \"%s\", ", pass->name);
    if (pass->N) printf("\"N\": %d, ", pass->N);
    printf("\"B\": %d, \"samples_us\": [", b->B);
    for (int r = 0; r < reps; r++) {
        float ms = 0.0f;
        CUDA(cudaEventRecord(start, s));
        for (int i = 0; i < calls_per_rep; i++) CUDA(cudaGraphLaunch(exec, s));
        CUDA(cudaEventRecord(end, s));
        CUDA(cudaEventSynchronize(end));
        CUDA(cudaEventElapsedTime(&ms, start, end));
        printf("%s%.4f", r ? ", " : "", 1e3 * ms / calls_per_rep);
    }
    printf("]}\n");
    fflush(stdout);
    CUDA(cudaEventDestroy(start));
    CUDA(cudaEventDestroy(end));
    CUDA(cudaGraphExecDestroy(exec));
    CUDA(cudaGraphDestroy(graph));
}

static int integer(const char *text, int minimum) {
    char *end;
    long value = strtol(text, &end, 10);
    if (*end != '\0' || value < minimum || value > INT32_MAX) {
        fprintf(stderr, "foxcute_bench: '%s' is not an integer >= %d\n", text, minimum);
        exit(2);
    }
    return (int)value;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s B Q H_IQN WARMUP REPS CALLS_PER_REP\n", argv[0]);
        return 2;
    }
    static bench_t b;
    b.B = integer(argv[1], 1), b.Q = integer(argv[2], 1), b.H_iqn = integer(argv[3], 1);
    int warmup = integer(argv[4], 0), reps = integer(argv[5], 1), calls_per_rep = integer(argv[6], 1);

    check_status("foxcute_load", foxcute_load());
    cudaStream_t s;
    CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    allocate(&b);
    CUDA(cudaDeviceSynchronize()); /* the uploads and memsets ran on the legacy stream, not s */

    const size_t B = b.B;
    const size_t F = FOXCUTE_CURIOSITY_F, A = FOXCUTE_CURIOSITY_A, HC = FOXCUTE_CURIOSITY_H;
    const span_t m2f_out = {b.out, B * FOXCUTE_MAMBA2_SH2};
    const span_t curiosity_out[] = {{b.r, B}, {b.ds, B * F}, {b.dW1, HC * (F + A)}, {b.dW2, F * HC},
                                    {b.c_sums, FOXCUTE_CURIOSITY_SUMS}};
    const span_t risk_out = {b.risk, B};
    const span_t q_out[] = {{b.dq, B * FOXCUTE_Q_DENOISE_A}, {b.q_grads, FOXCUTE_Q_DENOISE_GRADS}};
    const span_t head_out = {b.head_sum, A}, hidden_out = {b.hidden_sum, (size_t)b.H_iqn};
    const span_t kan_forward_out = {b.y, B * FOXCUTE_KAN_O};
    /* dC and dWb: the floats between them are padding, never written */
    const span_t kan_out[] = {{b.dx, B * FOXCUTE_KAN_I},
                              {b.kan_grads, (size_t)FOXCUTE_KAN_O * FOXCUTE_KAN_I * FOXCUTE_KAN_G},
                              {b.kan_grads + FOXCUTE_KAN_DWB, (size_t)FOXCUTE_KAN_O * FOXCUTE_KAN_I}};
    /* up to dsigma: the entries past it are padding */
    const span_t m2b_out[] = {{b.dh_hist, B * FOXCUTE_MAMBA2_K * FOXCUTE_MAMBA2_SH2}, {b.dh, B * FOXCUTE_MAMBA2_SH2},
                              {b.m2_grads, FOXCUTE_MAMBA2_DSIGMA + 1}};

    pass_t passes[] = {
        {"mamba2_forward", 0, mamba2_forward, {m2f_out}},
        {"curiosity_forward_backward", 0, curiosity,
         {curiosity_out[0], curiosity_out[1], curiosity_out[2], curiosity_out[3], curiosity_out[4]}},
        {"risk_budget_forward", 0, risk_budget, {risk_out}},
        {"q_denoise_loss_and_grads", 0, q_denoise, {q_out[0], q_out[1]}},
        {"column_sum", FOXCUTE_CURIOSITY_A, column_sum_head, {head_out}},
        {"column_sum", b.H_iqn, column_sum_hidden, {hidden_out}},
        {"kan_forward", 0, kan_forward, {kan_forward_out}},
        {"kan_backward", 0, kan_backward, {kan_out[0], kan_out[1], kan_out[2]}},
        {"mamba2_backward", 0, mamba2_backward, {m2b_out[0], m2b_out[1], m2b_out[2]}},
        {"step", 0, step, {m2f_out, curiosity_out[0], curiosity_out[1], curiosity_out[2], curiosity_out[3],
                           curiosity_out[4], risk_out, q_out[1], head_out, hidden_out, kan_out[0], m2b_out[2]}},
    };
    const int count = (int)(sizeof passes / sizeof passes[0]);
    for (int i = 0; i < count; i++) {
        if (passes[i].launch == column_sum_hidden && b.H_iqn == FOXCUTE_CURIOSITY_A) continue; /* one width: once */
        time_pass(&b, &passes[i], s, warmup, reps, calls_per_rep);
    }
    CUDA(cudaStreamDestroy(s));
    check_status("foxcute_unload", foxcute_unload());
    return 0;
}
