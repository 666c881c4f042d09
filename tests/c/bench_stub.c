/* CPU stand-ins for the CUDA runtime calls of foxcute/export/c/foxcute_bench.c and for
 * foxcute.h's passes, so that tests/test_export.py runs the harness's whole control flow
 * without a GPU: "device" memory is host memory; a pass reads the last element of each input
 * (the sizes the harness allocated) and writes 0.5f over each output (the sections foxcute.h
 * documents), or, during a capture, records those writes for cudaGraphLaunch to replay.
 * NOLAUNCH set in the environment: a replay writes nothing (a capture that missed the
 * stream), which the harness's replay check must catch. Every event pair reads 0.01 ms. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "foxcute.h"
typedef struct { void *p; size_t n; } w_t;
#define MAX_WRITES 64
static w_t rec[MAX_WRITES];
static int nrec, capturing;
typedef struct { w_t w[MAX_WRITES]; int n; } graph_s;
static void emit(void *p, size_t floats) {
    if (capturing) {
        if (nrec == MAX_WRITES) abort();
        rec[nrec].p = p, rec[nrec].n = floats, nrec++;
        return;
    }
    for (size_t i = 0; i < floats; i++) ((float *)p)[i] = 0.5f;
}
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "stub"; }
cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); return cudaSuccess; }
cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) { (void)s; memset(p, v, n); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { (void)k; memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) { (void)f; *s = (cudaStream_t)1; return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) { (void)s; (void)m; capturing = 1; nrec = 0; return cudaSuccess; }
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) { (void)s; graph_s *G = malloc(sizeof *G); memcpy(G->w, rec, sizeof rec); G->n = nrec; capturing = 0; *g = (cudaGraph_t)G; return cudaSuccess; }
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) { (void)f; *e = (cudaGraphExec_t)g; return cudaSuccess; }
cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t s) { (void)e; (void)s; return cudaSuccess; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    (void)s;
    graph_s *G = (graph_s *)e;
    if (getenv("NOLAUNCH")) return cudaSuccess;
    for (int i = 0; i < G->n; i++)
        for (size_t j = 0; j < G->w[i].n; j++) ((float *)G->w[i].p)[j] = 0.5f;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { free(g); return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)1; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)e; (void)s; return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { (void)a; (void)b; *ms = 0.01f; return cudaSuccess; }

int foxcute_load(void) { return 0; }
int foxcute_unload(void) { return 0; }
const char *foxcute_status_string(int s) { (void)s; return "stub"; }
int foxcute_column_sum_workspace_bytes(int32_t M, int32_t N, size_t *b) { (void)M; (void)N; *b = 64; return 0; }
int foxcute_column_sum(const float *G, float *out, int32_t M, int32_t N, void *ws, size_t wb, cudaStream_t s) {
    (void)s; (void)wb; (void)ws; volatile float x = G[(size_t)M * N - 1]; (void)x; emit(out, N); return 0; }
int foxcute_q_denoise_workspace_bytes(int32_t B, int32_t A, int32_t H, size_t *b) { (void)B; (void)A; (void)H; *b = 64; return 0; }
int foxcute_q_denoise_loss_and_grads(const float *q, const float *qt, const float *W1, const float *b1, const float *W2,
    const float *b2, float *dq, float *grads, int32_t B, int32_t A, int32_t H, void *ws, size_t wb, cudaStream_t s) {
    (void)ws; (void)wb; (void)s; volatile float x = q[B*A-1] + qt[B*A-1] + W1[H*A-1] + b1[H-1] + W2[A*H-1] + b2[A-1]; (void)x;
    emit(dq, (size_t)B * A); emit(grads, FOXCUTE_Q_DENOISE_GRADS); return 0; }
int foxcute_risk_budget_forward(const float *h, const float *isv, const float *e, const float *W1, const float *b1,
    const float *w2, float b2, float *risk, int32_t B, int32_t SH2, int32_t I, int32_t H, cudaStream_t s) {
    (void)s; (void)b2; volatile float x = h[(size_t)B*SH2-1] + isv[I-1] + e[B-1] + W1[H*(SH2+I+1)-1] + b1[H-1] + w2[H-1]; (void)x;
    emit(risk, B); return 0; }
int foxcute_kan_forward(const float *x, const float *C, const float *Wb, float *y, int32_t B, int32_t I, int32_t O, int32_t G, cudaStream_t s) {
    (void)s; volatile float v = x[B*I-1] + C[O*I*G-1] + Wb[O*I-1]; (void)v; emit(y, (size_t)B * O); return 0; }
int foxcute_kan_backward_workspace_bytes(int32_t B, int32_t I, int32_t O, int32_t G, size_t *b) { (void)B; (void)I; (void)O; (void)G; *b = 64; return 0; }
int foxcute_kan_backward(const float *dy, const float *x, const float *C, const float *Wb, float *dx, float *grads,
    int32_t B, int32_t I, int32_t O, int32_t G, void *ws, size_t wb, cudaStream_t s) {
    (void)ws; (void)wb; (void)s; volatile float v = dy[B*O-1] + x[B*I-1] + C[O*I*G-1] + Wb[O*I-1]; (void)v;
    emit(dx, (size_t)B * I); emit(grads, (size_t)O * I * G); emit(grads + FOXCUTE_KAN_DWB, (size_t)O * I); return 0; }
int foxcute_curiosity_workspace_bytes(int32_t B, int32_t F, int32_t A, int32_t H, size_t *b) { (void)B; (void)F; (void)A; (void)H; *b = 64; return 0; }
int foxcute_curiosity_forward_backward(const float *s, const int32_t *a, const float *sn, const float *W1, const float *b1,
    const float *W2, const float *b2, float *r, float *ds, float *dW1, float *dW2, float *sums, int32_t B, int32_t F,
    int32_t A, int32_t H, void *ws, size_t wb, cudaStream_t st) {
    (void)ws; (void)wb; (void)st; for (int i = 0; i < B; i++) if (a[i] < 0 || a[i] >= A) abort();
    volatile float v = s[(size_t)B*F-1] + sn[(size_t)B*F-1] + W1[H*(F+A)-1] + b1[H-1] + W2[F*H-1] + b2[F-1]; (void)v;
    emit(r, B); emit(ds, (size_t)B * F); emit(dW1, (size_t)H * (F + A)); emit(dW2, (size_t)F * H); emit(sums, FOXCUTE_CURIOSITY_SUMS); return 0; }
int foxcute_mamba2_forward(const float *hh, const float *h, const float *WA, const float *WB, const float *WC, const float *w,
    float sigma, float *out, int32_t B, int32_t K, int32_t SH2, int32_t D, cudaStream_t s) {
    (void)s; (void)sigma; volatile float v = hh[(size_t)B*K*SH2-1] + h[B*SH2-1] + WA[SH2*D-1] + WB[SH2*D-1] + WC[SH2*D-1] + w[SH2-1]; (void)v;
    emit(out, (size_t)B * SH2); return 0; }
int foxcute_mamba2_backward_workspace_bytes(int32_t B, int32_t K, int32_t SH2, int32_t D, size_t *b) { (void)B; (void)K; (void)SH2; (void)D; *b = 64; return 0; }
int foxcute_mamba2_backward(const float *dout, const float *hh, const float *h, const float *WA, const float *WB, const float *WC,
    const float *w, float sigma, float *dhh, float *dh, float *grads, int32_t B, int32_t K, int32_t SH2, int32_t D,
    void *ws, size_t wb, cudaStream_t s) {
    (void)ws; (void)wb; (void)s; (void)sigma; volatile float v = dout[B*SH2-1] + hh[(size_t)B*K*SH2-1] + h[B*SH2-1] + WA[SH2*D-1] + WB[SH2*D-1] + WC[SH2*D-1] + w[SH2-1]; (void)v;
    emit(dhh, (size_t)B * K * SH2); emit(dh, (size_t)B * SH2); emit(grads, FOXCUTE_MAMBA2_DSIGMA + 1); return 0; }
