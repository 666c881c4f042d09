/* The C test of an exported foxcute library (tests/test_export.py builds it on the CPU,
 * tests/test_gpu_export.py runs it on the H200).
 *
 *   foxcute_test validate   every argument check of foxcute.h that precedes any CUDA call:
 *                           runs without a GPU; exit 0 when every check gave its documented code
 *   foxcute_test run DIR    the cases of DIR/cases.txt on the GPU, inputs from DIR/<case>.<arg>.bin
 *                           (raw float32, written by Python); writes each output three times,
 *                           DIR/<case>.<output>.{first,second,graph}.bin: two plain runs, then the
 *                           outputs after two replays of one CUDA graph that captured every case
 *                           (the outputs are set to NaN before the replays, so a replay that
 *                           launched nothing leaves NaN). Exit 0 when every call returned FOXCUTE_OK.
 *
 * cases.txt, one case a line: `NAME column_sum M N`, `NAME q_denoise B`, `NAME risk_budget B b2`,
 * `NAME kan_forward B`, `NAME kan_backward B`, `NAME curiosity B` (its actions file holds int32),
 * `NAME mamba2_forward B sigma`, `NAME mamba2_backward B sigma`.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foxcute.h"

static int failures;

static void expect(const char *what, int got, int want) {
    if (got != want) {
        printf("FAIL %s: status %d (%s), expected %d (%s)\n", what, got, foxcute_status_string(got), want,
               foxcute_status_string(want));
        failures++;
    }
}

/* ---- validate: no CUDA call happens, so fake device addresses are never dereferenced ---- */

#define P ((float *)(uintptr_t)0x10000)          /* aligned, never dereferenced */
#define ODD ((float *)(uintptr_t)0x10004)        /* 4 bytes off the 16-byte grid */
#define WS ((void *)(uintptr_t)0x20000)

static void validate_column_sum(void) {
    int widths[] = FOXCUTE_COLUMN_SUM_WIDTHS;
    int32_t n = widths[0];
    size_t bytes = 0;
    expect("column_sum null G", foxcute_column_sum(NULL, P, 64, n, WS, 1 << 20, 0), FOXCUTE_ERR_NULL_POINTER);
    expect("column_sum null workspace", foxcute_column_sum(P, P, 64, n, NULL, 1 << 20, 0), FOXCUTE_ERR_NULL_POINTER);
    expect("column_sum null before misaligned", foxcute_column_sum(ODD, NULL, 64, n, WS, 1 << 20, 0),
           FOXCUTE_ERR_NULL_POINTER);
    expect("column_sum misaligned out", foxcute_column_sum(P, ODD, 64, n, WS, 1 << 20, 0), FOXCUTE_ERR_MISALIGNED);
    expect("column_sum misaligned workspace", foxcute_column_sum(P, P, 64, n, (char *)WS + 8, 1 << 20, 0),
           FOXCUTE_ERR_MISALIGNED);
    expect("column_sum N not compiled", foxcute_column_sum(P, P, 64, 4097, WS, 1 << 20, 0), FOXCUTE_ERR_SIZE);
    expect("column_sum M = 0", foxcute_column_sum(P, P, 0, n, WS, 1 << 20, 0), FOXCUTE_ERR_SIZE);
    expect("column_sum M*N >= 2^31", foxcute_column_sum(P, P, INT32_MAX / n + 1, n, WS, 1 << 20, 0),
           FOXCUTE_ERR_SIZE);
    expect("column_sum not loaded", foxcute_column_sum(P, P, 64, n, WS, 1 << 20, 0), FOXCUTE_ERR_NOT_LOADED);
    expect("column_sum workspace query null", foxcute_column_sum_workspace_bytes(64, n, NULL),
           FOXCUTE_ERR_NULL_POINTER);
    expect("column_sum workspace query N", foxcute_column_sum_workspace_bytes(64, 4097, &bytes), FOXCUTE_ERR_SIZE);
}

static int q_denoise(const float *q, float *dq, int32_t B, int32_t A, int32_t H, void *ws) {
    return foxcute_q_denoise_loss_and_grads(q, P, P, P, P, P, dq, P, B, A, H, ws, 1 << 20, 0);
}

static void validate_q_denoise(void) {
    const int32_t A = FOXCUTE_Q_DENOISE_A, H = FOXCUTE_Q_DENOISE_H;
    size_t bytes = 0;
    expect("q_denoise null q", q_denoise(NULL, P, 64, A, H, WS), FOXCUTE_ERR_NULL_POINTER);
    expect("q_denoise null workspace", q_denoise(P, P, 64, A, H, NULL), FOXCUTE_ERR_NULL_POINTER);
    expect("q_denoise misaligned dq", q_denoise(P, ODD, 64, A, H, WS), FOXCUTE_ERR_MISALIGNED);
    expect("q_denoise A not compiled", q_denoise(P, P, 64, A + 1, H, WS), FOXCUTE_ERR_SIZE);
    expect("q_denoise H not compiled", q_denoise(P, P, 64, A, H + 1, WS), FOXCUTE_ERR_SIZE);
    expect("q_denoise B = 0", q_denoise(P, P, 0, A, H, WS), FOXCUTE_ERR_SIZE);
    expect("q_denoise B too large", q_denoise(P, P, FOXCUTE_Q_DENOISE_MAX_B + 1, A, H, WS), FOXCUTE_ERR_SIZE);
    expect("q_denoise not loaded", q_denoise(P, P, 64, A, H, WS), FOXCUTE_ERR_NOT_LOADED);
    expect("q_denoise workspace query null", foxcute_q_denoise_workspace_bytes(64, A, H, NULL),
           FOXCUTE_ERR_NULL_POINTER);
    expect("q_denoise workspace query A", foxcute_q_denoise_workspace_bytes(64, A + 1, H, &bytes), FOXCUTE_ERR_SIZE);
}

static int risk(const float *h, float b2, int32_t B, int32_t SH2, int32_t I, int32_t H) {
    return foxcute_risk_budget_forward(h, P, P, P, P, P, b2, P, B, SH2, I, H, 0);
}

static void validate_risk_budget(void) {
    const int32_t SH2 = FOXCUTE_RISK_BUDGET_SH2, I = FOXCUTE_RISK_BUDGET_I, H = FOXCUTE_RISK_BUDGET_H;
    expect("risk_budget null h", risk(NULL, 0.f, 64, SH2, I, H), FOXCUTE_ERR_NULL_POINTER);
    expect("risk_budget misaligned h", risk(ODD, 0.f, 64, SH2, I, H), FOXCUTE_ERR_MISALIGNED);
    expect("risk_budget SH2 not compiled", risk(P, 0.f, 64, SH2 + 4, I, H), FOXCUTE_ERR_SIZE);
    expect("risk_budget I not compiled", risk(P, 0.f, 64, SH2, I + 1, H), FOXCUTE_ERR_SIZE);
    expect("risk_budget H not compiled", risk(P, 0.f, 64, SH2, I, H + 4), FOXCUTE_ERR_SIZE);
    expect("risk_budget B = 0", risk(P, 0.f, 0, SH2, I, H), FOXCUTE_ERR_SIZE);
    expect("risk_budget b2 NaN", risk(P, NAN, 64, SH2, I, H), FOXCUTE_ERR_VALUE);
    expect("risk_budget b2 inf", risk(P, INFINITY, 64, SH2, I, H), FOXCUTE_ERR_VALUE);
    expect("risk_budget not loaded", risk(P, 0.f, 64, SH2, I, H), FOXCUTE_ERR_NOT_LOADED);
}

static int kan_backward(const float *dy, float *grads, int32_t B, int32_t I, int32_t O, int32_t G, void *ws) {
    return foxcute_kan_backward(dy, P, P, P, P, grads, B, I, O, G, ws, 1 << 20, 0);
}

static void validate_kan(void) {
    const int32_t I = FOXCUTE_KAN_I, O = FOXCUTE_KAN_O, G = FOXCUTE_KAN_G;
    size_t bytes = 0;
    expect("kan_forward null y", foxcute_kan_forward(P, P, P, NULL, 64, I, O, G, 0), FOXCUTE_ERR_NULL_POINTER);
    expect("kan_forward misaligned x", foxcute_kan_forward(ODD, P, P, P, 64, I, O, G, 0), FOXCUTE_ERR_MISALIGNED);
    expect("kan_forward G not compiled", foxcute_kan_forward(P, P, P, P, 64, I, O, G + 1, 0), FOXCUTE_ERR_SIZE);
    expect("kan_forward B too large", foxcute_kan_forward(P, P, P, P, FOXCUTE_KAN_MAX_B + 1, I, O, G, 0),
           FOXCUTE_ERR_SIZE);
    expect("kan_forward not loaded", foxcute_kan_forward(P, P, P, P, 64, I, O, G, 0), FOXCUTE_ERR_NOT_LOADED);
    expect("kan_backward null workspace", kan_backward(P, P, 64, I, O, G, NULL), FOXCUTE_ERR_NULL_POINTER);
    expect("kan_backward misaligned grads", kan_backward(P, ODD, 64, I, O, G, WS), FOXCUTE_ERR_MISALIGNED);
    expect("kan_backward I not compiled", kan_backward(P, P, 64, I + 1, O, G, WS), FOXCUTE_ERR_SIZE);
    expect("kan_backward O not compiled", kan_backward(P, P, 64, I, O + 2, G, WS), FOXCUTE_ERR_SIZE);
    expect("kan_backward B = 0", kan_backward(P, P, 0, I, O, G, WS), FOXCUTE_ERR_SIZE);
    expect("kan_backward not loaded", kan_backward(P, P, 64, I, O, G, WS), FOXCUTE_ERR_NOT_LOADED);
    expect("kan_backward workspace query G", foxcute_kan_backward_workspace_bytes(64, I, O, G + 1, &bytes),
           FOXCUTE_ERR_SIZE);
}

static int curiosity(const float *s, const int32_t *a, float *sums, int32_t B, int32_t F, int32_t A, int32_t H,
                     void *ws) {
    return foxcute_curiosity_forward_backward(s, a, P, P, P, P, P, P, P, P, P, sums, B, F, A, H, ws, 1 << 20, 0);
}

static void validate_curiosity(void) {
    const int32_t F = FOXCUTE_CURIOSITY_F, A = FOXCUTE_CURIOSITY_A, H = FOXCUTE_CURIOSITY_H;
    const int32_t *actions = (const int32_t *)P, *odd_actions = (const int32_t *)ODD;
    size_t bytes = 0;
    expect("curiosity null a", curiosity(P, NULL, P, 64, F, A, H, WS), FOXCUTE_ERR_NULL_POINTER);
    expect("curiosity null workspace", curiosity(P, actions, P, 64, F, A, H, NULL), FOXCUTE_ERR_NULL_POINTER);
    expect("curiosity misaligned a", curiosity(P, odd_actions, P, 64, F, A, H, WS), FOXCUTE_ERR_MISALIGNED);
    expect("curiosity misaligned sums", curiosity(P, actions, ODD, 64, F, A, H, WS), FOXCUTE_ERR_MISALIGNED);
    expect("curiosity F not compiled", curiosity(P, actions, P, 64, F + 32, A, H, WS), FOXCUTE_ERR_SIZE);
    expect("curiosity A not compiled", curiosity(P, actions, P, 64, F, A + 1, H, WS), FOXCUTE_ERR_SIZE);
    expect("curiosity B too large", curiosity(P, actions, P, FOXCUTE_CURIOSITY_MAX_B + 1, F, A, H, WS),
           FOXCUTE_ERR_SIZE);
    expect("curiosity not loaded", curiosity(P, actions, P, 64, F, A, H, WS), FOXCUTE_ERR_NOT_LOADED);
    expect("curiosity workspace query H", foxcute_curiosity_workspace_bytes(64, F, A, H + 32, &bytes),
           FOXCUTE_ERR_SIZE);
}

static int mamba2_backward(const float *dout, float sigma, int32_t B, int32_t K, int32_t SH2, int32_t D, void *ws) {
    return foxcute_mamba2_backward(dout, P, P, P, P, P, P, sigma, P, P, P, B, K, SH2, D, ws, 1 << 20, 0);
}

static void validate_mamba2(void) {
    const int32_t K = FOXCUTE_MAMBA2_K, SH2 = FOXCUTE_MAMBA2_SH2, D = FOXCUTE_MAMBA2_D;
    size_t bytes = 0;
    expect("mamba2_forward null w", foxcute_mamba2_forward(P, P, P, P, P, NULL, 1.f, P, 64, K, SH2, D, 0),
           FOXCUTE_ERR_NULL_POINTER);
    expect("mamba2_forward misaligned h", foxcute_mamba2_forward(P, ODD, P, P, P, P, 1.f, P, 64, K, SH2, D, 0),
           FOXCUTE_ERR_MISALIGNED);
    expect("mamba2_forward D not compiled", foxcute_mamba2_forward(P, P, P, P, P, P, 1.f, P, 64, K, SH2, D * 2, 0),
           FOXCUTE_ERR_SIZE);
    expect("mamba2_forward sigma NaN", foxcute_mamba2_forward(P, P, P, P, P, P, NAN, P, 64, K, SH2, D, 0),
           FOXCUTE_ERR_VALUE);
    expect("mamba2_forward not loaded", foxcute_mamba2_forward(P, P, P, P, P, P, 1.f, P, 64, K, SH2, D, 0),
           FOXCUTE_ERR_NOT_LOADED);
    expect("mamba2_backward null dout", mamba2_backward(NULL, 1.f, 64, K, SH2, D, WS), FOXCUTE_ERR_NULL_POINTER);
    expect("mamba2_backward misaligned workspace", mamba2_backward(P, 1.f, 64, K, SH2, D, (char *)WS + 4),
           FOXCUTE_ERR_MISALIGNED);
    expect("mamba2_backward K not compiled", mamba2_backward(P, 1.f, 64, K + 1, SH2, D, WS), FOXCUTE_ERR_SIZE);
    expect("mamba2_backward B too large", mamba2_backward(P, 1.f, FOXCUTE_MAMBA2_MAX_B + 1, K, SH2, D, WS),
           FOXCUTE_ERR_SIZE);
    expect("mamba2_backward sigma inf", mamba2_backward(P, -INFINITY, 64, K, SH2, D, WS), FOXCUTE_ERR_VALUE);
    expect("mamba2_backward not loaded", mamba2_backward(P, 1.f, 64, K, SH2, D, WS), FOXCUTE_ERR_NOT_LOADED);
    expect("mamba2_backward workspace query SH2", foxcute_mamba2_backward_workspace_bytes(64, K, SH2 + 64, D, &bytes),
           FOXCUTE_ERR_SIZE);
}

static int validate(void) {
    validate_column_sum();
    validate_q_denoise();
    validate_risk_budget();
    validate_kan();
    validate_curiosity();
    validate_mamba2();
    expect("unload before load", foxcute_unload(), FOXCUTE_OK);
    printf("validate: %d failure(s)\n", failures);
    return failures != 0;
}

/* ---- run: the passes on the GPU ---- */

#define MAX_BUFFERS 12
#define MAX_CASES 64

typedef struct {
    char name[16];
    size_t count; /* floats */
    float *device;
} buffer_t;

typedef struct case_s {
    char name[64], pass[32];
    int32_t M, N, B;
    float scalar; /* the risk budget's b2, Mamba2's sigma */
    int inputs, outputs;
    buffer_t buffers[MAX_BUFFERS]; /* inputs, then outputs */
    void *workspace;
    size_t workspace_bytes;
} case_t;

static int cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
        failures++;
    }
    return e == cudaSuccess;
}

static void add(case_t *c, const char *name, size_t count, int output) {
    buffer_t *b = &c->buffers[c->inputs + c->outputs];
    snprintf(b->name, sizeof b->name, "%s", name);
    b->count = count;
    output ? c->outputs++ : c->inputs++;
}

static float *buf(case_t *c, int i) { return c->buffers[i].device; }

/* The pass of case c with its buffers (inputs in order, then outputs). */
static int launch(case_t *c, size_t workspace_bytes, cudaStream_t s) {
    if (!strcmp(c->pass, "column_sum"))
        return foxcute_column_sum(buf(c, 0), buf(c, 1), c->M, c->N, c->workspace, workspace_bytes, s);
    if (!strcmp(c->pass, "q_denoise"))
        return foxcute_q_denoise_loss_and_grads(buf(c, 0), buf(c, 1), buf(c, 2), buf(c, 3), buf(c, 4), buf(c, 5),
                                                buf(c, 6), buf(c, 7), c->B, FOXCUTE_Q_DENOISE_A,
                                                FOXCUTE_Q_DENOISE_H, c->workspace, workspace_bytes, s);
    if (!strcmp(c->pass, "curiosity"))
        return foxcute_curiosity_forward_backward(buf(c, 0), (const int32_t *)buf(c, 1), buf(c, 2), buf(c, 3),
                                                  buf(c, 4), buf(c, 5), buf(c, 6), buf(c, 7), buf(c, 8), buf(c, 9),
                                                  buf(c, 10), buf(c, 11), c->B, FOXCUTE_CURIOSITY_F,
                                                  FOXCUTE_CURIOSITY_A, FOXCUTE_CURIOSITY_H, c->workspace,
                                                  workspace_bytes, s);
    if (!strcmp(c->pass, "mamba2_forward"))
        return foxcute_mamba2_forward(buf(c, 0), buf(c, 1), buf(c, 2), buf(c, 3), buf(c, 4), buf(c, 5), c->scalar,
                                      buf(c, 6), c->B, FOXCUTE_MAMBA2_K, FOXCUTE_MAMBA2_SH2, FOXCUTE_MAMBA2_D, s);
    if (!strcmp(c->pass, "mamba2_backward"))
        return foxcute_mamba2_backward(buf(c, 0), buf(c, 1), buf(c, 2), buf(c, 3), buf(c, 4), buf(c, 5), buf(c, 6),
                                       c->scalar, buf(c, 7), buf(c, 8), buf(c, 9), c->B, FOXCUTE_MAMBA2_K,
                                       FOXCUTE_MAMBA2_SH2, FOXCUTE_MAMBA2_D, c->workspace, workspace_bytes, s);
    if (!strcmp(c->pass, "kan_forward"))
        return foxcute_kan_forward(buf(c, 0), buf(c, 1), buf(c, 2), buf(c, 3), c->B, FOXCUTE_KAN_I, FOXCUTE_KAN_O,
                                   FOXCUTE_KAN_G, s);
    if (!strcmp(c->pass, "kan_backward"))
        return foxcute_kan_backward(buf(c, 0), buf(c, 1), buf(c, 2), buf(c, 3), buf(c, 4), buf(c, 5), c->B,
                                    FOXCUTE_KAN_I, FOXCUTE_KAN_O, FOXCUTE_KAN_G, c->workspace, workspace_bytes, s);
    return foxcute_risk_budget_forward(buf(c, 0), buf(c, 1), buf(c, 2), buf(c, 3), buf(c, 4), buf(c, 5), c->scalar,
                                       buf(c, 6), c->B, FOXCUTE_RISK_BUDGET_SH2, FOXCUTE_RISK_BUDGET_I,
                                       FOXCUTE_RISK_BUDGET_H, s);
}

/* The buffers and the workspace size of the case's pass; 0 where the pass is unknown. */
static int describe(case_t *c) {
    const size_t A = FOXCUTE_Q_DENOISE_A, H = FOXCUTE_Q_DENOISE_H;
    const size_t SH2 = FOXCUTE_RISK_BUDGET_SH2, I = FOXCUTE_RISK_BUDGET_I, HR = FOXCUTE_RISK_BUDGET_H;
    if (!strcmp(c->pass, "column_sum")) {
        add(c, "G", (size_t)c->M * c->N, 0);
        add(c, "out", c->N, 1);
        expect("column_sum workspace query", foxcute_column_sum_workspace_bytes(c->M, c->N, &c->workspace_bytes),
               FOXCUTE_OK);
    } else if (!strcmp(c->pass, "q_denoise")) {
        const char *in[] = {"q", "q_target", "W1", "b1", "W2", "b2"};
        size_t count[] = {c->B * A, c->B * A, H * A, H, A * H, A};
        for (int i = 0; i < 6; i++) add(c, in[i], count[i], 0);
        add(c, "dq", c->B * A, 1);
        add(c, "grads", FOXCUTE_Q_DENOISE_GRADS, 1);
        expect("q_denoise workspace query",
               foxcute_q_denoise_workspace_bytes(c->B, (int32_t)A, (int32_t)H, &c->workspace_bytes), FOXCUTE_OK);
    } else if (!strcmp(c->pass, "risk_budget")) {
        const char *in[] = {"h", "isv", "e", "W1", "b1", "w2"};
        size_t count[] = {c->B * SH2, I, c->B, HR * (SH2 + I + 1), HR, HR};
        for (int i = 0; i < 6; i++) add(c, in[i], count[i], 0);
        add(c, "risk", c->B, 1);
    } else if (!strcmp(c->pass, "mamba2_forward") || !strcmp(c->pass, "mamba2_backward")) {
        const size_t K = FOXCUTE_MAMBA2_K, SH2 = FOXCUTE_MAMBA2_SH2, D = FOXCUTE_MAMBA2_D;
        int backward = !strcmp(c->pass, "mamba2_backward");
        if (backward) add(c, "dout", c->B * SH2, 0);
        const char *in[] = {"h_hist", "h", "W_A", "W_B", "W_C", "w"};
        size_t count[] = {c->B * K * SH2, c->B * SH2, SH2 * D, SH2 * D, SH2 * D, SH2};
        for (int i = 0; i < 6; i++) add(c, in[i], count[i], 0);
        if (!backward) {
            add(c, "out", c->B * SH2, 1);
            return 1;
        }
        add(c, "dh_hist", c->B * K * SH2, 1);
        add(c, "dh", c->B * SH2, 1);
        add(c, "grads", FOXCUTE_MAMBA2_GRADS, 1);
        expect("mamba2_backward workspace query",
               foxcute_mamba2_backward_workspace_bytes(c->B, (int32_t)K, (int32_t)SH2, (int32_t)D,
                                                       &c->workspace_bytes), FOXCUTE_OK);
    } else if (!strcmp(c->pass, "curiosity")) {
        const size_t F = FOXCUTE_CURIOSITY_F, A = FOXCUTE_CURIOSITY_A, H = FOXCUTE_CURIOSITY_H;
        const char *in[] = {"s", "a", "s_next", "W1", "b1", "W2", "b2"}; /* a: int32, 4 bytes like a float */
        size_t count[] = {c->B * F, c->B, c->B * F, H * (F + A), H, F * H, F};
        for (int i = 0; i < 7; i++) add(c, in[i], count[i], 0);
        const char *out[] = {"r", "ds", "dW1", "dW2", "sums"};
        size_t out_count[] = {c->B, c->B * F, H * (F + A), F * H, FOXCUTE_CURIOSITY_SUMS};
        for (int i = 0; i < 5; i++) add(c, out[i], out_count[i], 1);
        expect("curiosity workspace query",
               foxcute_curiosity_workspace_bytes(c->B, (int32_t)F, (int32_t)A, (int32_t)H, &c->workspace_bytes),
               FOXCUTE_OK);
    } else if (!strcmp(c->pass, "kan_forward") || !strcmp(c->pass, "kan_backward")) {
        const size_t I = FOXCUTE_KAN_I, O = FOXCUTE_KAN_O, G = FOXCUTE_KAN_G;
        int backward = !strcmp(c->pass, "kan_backward");
        if (backward) add(c, "dy", c->B * O, 0);
        add(c, "x", c->B * I, 0);
        add(c, "C", O * I * G, 0);
        add(c, "Wb", O * I, 0);
        if (!backward) {
            add(c, "y", c->B * O, 1);
            return 1;
        }
        add(c, "dx", c->B * I, 1);
        add(c, "grads", FOXCUTE_KAN_GRADS, 1);
        expect("kan_backward workspace query",
               foxcute_kan_backward_workspace_bytes(c->B, (int32_t)I, (int32_t)O, (int32_t)G, &c->workspace_bytes),
               FOXCUTE_OK);
    } else {
        return 0;
    }
    return 1;
}

/* fopen of the path `format` makes (vsnprintf: the names come from the command line and
 * cases.txt); NULL, counted as a failure, where the path is too long or cannot be opened. */
static FILE *open_path(const char *mode, const char *format, ...) {
    char path[4096];
    va_list args;
    va_start(args, format);
    int length = vsnprintf(path, sizeof path, format, args);
    va_end(args);
    FILE *f = length >= 0 && (size_t)length < sizeof path ? fopen(path, mode) : NULL;
    if (f == NULL) {
        printf("FAIL cannot open %s\n", path);
        failures++;
    }
    return f;
}

static int read_floats(FILE *f, float *host, size_t count) {
    size_t got = f ? fread(host, sizeof(float), count, f) : 0;
    if (f) fclose(f);
    if (f && got != count) {
        printf("FAIL read %zu of %zu floats\n", got, count);
        failures++;
    }
    return got == count;
}

static void write_floats(FILE *f, const float *host, size_t count) {
    if (f && fwrite(host, sizeof(float), count, f) != count) {
        printf("FAIL wrote fewer than %zu floats\n", count);
        failures++;
    }
    if (f) fclose(f);
}

/* Device buffers (inputs read from DIR), and the workspace, zeroed once as foxcute.h asks. */
static void setup(case_t *c, const char *dir) {
    for (int i = 0; i < c->inputs + c->outputs; i++) {
        buffer_t *b = &c->buffers[i];
        cuda_ok(cudaMalloc((void **)&b->device, b->count * sizeof(float)), "cudaMalloc");
        if (i >= c->inputs) continue;
        float *host = malloc(b->count * sizeof(float));
        if (read_floats(open_path("rb", "%s/%s.%s.bin", dir, c->name, b->name), host, b->count))
            cuda_ok(cudaMemcpy(b->device, host, b->count * sizeof(float), cudaMemcpyHostToDevice), "upload");
        free(host);
    }
    if (c->workspace_bytes == 0) return; /* the risk budget needs none */
    cuda_ok(cudaMalloc(&c->workspace, c->workspace_bytes), "cudaMalloc workspace");
    cuda_ok(cudaMemset(c->workspace, 0, c->workspace_bytes), "zero the workspace once");
}

static void save_outputs(case_t *c, const char *dir, const char *run) {
    for (int i = c->inputs; i < c->inputs + c->outputs; i++) {
        buffer_t *b = &c->buffers[i];
        float *host = malloc(b->count * sizeof(float));
        cuda_ok(cudaMemcpy(host, b->device, b->count * sizeof(float), cudaMemcpyDeviceToHost), "download");
        write_floats(open_path("wb", "%s/%s.%s.%s.bin", dir, c->name, b->name, run), host, b->count);
        free(host);
    }
}

static int read_cases(const char *dir, case_t *cases) {
    char line[256];
    int n = 0;
    FILE *f = open_path("r", "%s/cases.txt", dir);
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        if (n == MAX_CASES) {
            printf("FAIL more than %d cases\n", MAX_CASES);
            failures++;
            break;
        }
        case_t *c = &cases[n];
        memset(c, 0, sizeof *c);
        int used = 0;
        if (sscanf(line, "%63s %31s%n", c->name, c->pass, &used) != 2) continue;
        const char *rest = line + used;
        if (!strcmp(c->pass, "column_sum")) sscanf(rest, "%d %d", &c->M, &c->N);
        else sscanf(rest, "%d %f", &c->B, &c->scalar);
        if (describe(c)) {
            n++;
        } else {
            printf("FAIL unknown pass '%s'\n", c->pass);
            failures++;
        }
    }
    fclose(f);
    return n;
}

/* Capture every case's pass into one graph, set the outputs to NaN, replay twice. */
static void graph_replays(case_t *cases, int n, cudaStream_t s) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (!cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture")) return;
    for (int i = 0; i < n; i++) expect("captured pass", launch(&cases[i], cases[i].workspace_bytes, s), FOXCUTE_OK);
    if (!cuda_ok(cudaStreamEndCapture(s, &graph), "end capture")) return;
    if (!cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) return;
    for (int i = 0; i < n; i++)
        for (int j = cases[i].inputs; j < cases[i].inputs + cases[i].outputs; j++)
            cuda_ok(cudaMemsetAsync(cases[i].buffers[j].device, 0xff, cases[i].buffers[j].count * sizeof(float), s),
                    "NaN"); /* on s: ordered before the replays */
    for (int r = 0; r < 2; r++) cuda_ok(cudaGraphLaunch(exec, s), "graph replay");
    cuda_ok(cudaStreamSynchronize(s), "replay sync");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
}

static int run(const char *dir) {
    static case_t cases[MAX_CASES];
    cudaStream_t s;
    expect("foxcute_load", foxcute_load(), FOXCUTE_OK);
    expect("foxcute_load again (does nothing)", foxcute_load(), FOXCUTE_OK);
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    int n = read_cases(dir, cases);
    for (int i = 0; i < n; i++) setup(&cases[i], dir);
    cuda_ok(cudaDeviceSynchronize(), "setup"); /* the uploads and memsets ran on the legacy stream, not s */
    for (int i = 0; i < n; i++) {
        if (cases[i].workspace_bytes > 0)
            expect("workspace one byte short", launch(&cases[i], cases[i].workspace_bytes - 1, s),
                   FOXCUTE_ERR_WORKSPACE);
        const char *runs[] = {"first", "second"};
        for (int r = 0; r < 2; r++) {
            expect(cases[i].name, launch(&cases[i], cases[i].workspace_bytes, s), FOXCUTE_OK);
            cuda_ok(cudaStreamSynchronize(s), cases[i].name);
            save_outputs(&cases[i], dir, runs[r]);
        }
    }
    graph_replays(cases, n, s);
    for (int i = 0; i < n; i++) save_outputs(&cases[i], dir, "graph");
    expect("foxcute_unload", foxcute_unload(), FOXCUTE_OK);
    printf("run: %d case(s), %d failure(s)\n", n, failures);
    return failures != 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "validate")) return validate();
    if (argc == 3 && !strcmp(argv[1], "run")) return run(argv[2]);
    fprintf(stderr, "usage: %s validate | run DIR\n", argv[0]);
    return 2;
}
