/* Off-policy GRPO through the C API of libcare: RLOO advantages (a non-default baseline and
 * scale, set through the option enums), the rollout correction from the inference engine's
 * log-probs (token-level truncated importance weights and a token_k1 rejection), and a CISPO
 * loss that applies them; on the GPU too when a driver and device are present, with the
 * rollout diagnostics read back from the device.
 * Usage: rollout_step
 * Every printed number is also checked here against what the formulas say (exit 1 if not). */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "care.h"

#define G 4        /* responses per prompt */
#define N 8        /* responses: two prompts */
#define L 5        /* tokens per response */
#define T (N * L)  /* tokens */
#define IS_CAP 1.5 /* upper truncation bound of the importance weights */

/* Stop with the library's message and the call's detail (which field, what to fix). */
static void fail(const char *file, int line, const char *call, care_result r) {
  char detail[1024];
  size_t n = 0;
  if (care_last_error_detail(detail, sizeof detail, &n) != CARE_OK) n = 0;
  fprintf(stderr, "%s:%d: %s -> %u %s: %.*s\n", file, line, call, (unsigned)r,
          care_result_message(r), (int)n, detail);
  exit(1);
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    care_result r_ = (call);                                                               \
    if (r_ != CARE_OK) fail(__FILE__, __LINE__, #call, r_);                                \
  } while (0)

#define EXPECT(cond)                                                                       \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);            \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* The CUDA driver calls of the GPU part, loaded at run time (no toolkit needed to build). */
typedef unsigned long long CUdeviceptr;
static struct {
  int (*init)(unsigned);
  int (*device_get)(int *, int);
  int (*primary_ctx_retain)(void **, int);
  int (*ctx_set_current)(void *);
  int (*mem_alloc)(CUdeviceptr *, size_t);
  int (*mem_free)(CUdeviceptr);
  int (*htod)(CUdeviceptr, const void *, size_t);
} cu;

static int load_sym(void *lib, const char *name, void *fn, size_t fn_size) {
  void *sym = dlsym(lib, name);
  if (!sym) return 0;
  memcpy(fn, &sym, fn_size); /* object pointer to function pointer, as -Wpedantic accepts */
  return 1;
}

static int cuda_open(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  int dev;
  void *ctx;
  return load_sym(lib, "cuInit", &cu.init, sizeof cu.init) &&
         load_sym(lib, "cuDeviceGet", &cu.device_get, sizeof cu.device_get) &&
         load_sym(lib, "cuDevicePrimaryCtxRetain", &cu.primary_ctx_retain, sizeof cu.primary_ctx_retain) &&
         load_sym(lib, "cuCtxSetCurrent", &cu.ctx_set_current, sizeof cu.ctx_set_current) &&
         load_sym(lib, "cuMemAlloc_v2", &cu.mem_alloc, sizeof cu.mem_alloc) &&
         load_sym(lib, "cuMemFree_v2", &cu.mem_free, sizeof cu.mem_free) &&
         load_sym(lib, "cuMemcpyHtoD_v2", &cu.htod, sizeof cu.htod) && cu.init(0) == 0 &&
         cu.device_get(&dev, 0) == 0 && cu.primary_ctx_retain(&ctx, dev) == 0 &&
         cu.ctx_set_current(ctx) == 0;
}

static CUdeviceptr to_device(const void *host, size_t bytes) {
  CUdeviceptr d = 0;
  if (cu.mem_alloc(&d, bytes) != 0 || (host && cu.htod(d, host, bytes) != 0)) {
    fprintf(stderr, "gpu: allocation or copy failed\n");
    exit(1);
  }
  return d;
}

#define DEV(p) ((void *)(uintptr_t)(p))

int main(void) {
  /* 1. RLOO advantages: leave-one-out baseline, no std scaling. */
  float rewards[N] = {0.9f, 0.2f, 0.5f, 0.0f, 1.0f, 0.6f, 0.6f, 0.1f};
  float adv[N];
  care_advantage_options ao;
  CHECK(care_advantage_options_default(&ao));
  ao.baseline = CARE_BASELINE_LEAVE_ONE_OUT;
  ao.scale = CARE_SCALE_NONE;
  care_rewards rw = {sizeof rw, rewards, N, NULL, 0, NULL, 0, NULL, 0};
  care_group_layout groups = {sizeof groups, G, NULL, 0};
  care_advantage_outputs aout = {sizeof aout, adv, N, NULL, 0};
  CHECK(care_group_advantages(&rw, &groups, &ao, &aout));
  printf("rloo advantages:");
  for (int i = 0; i < N; i++) {
    double others = 0;
    for (int j = i / G * G; j < i / G * G + G; j++) others += j == i ? 0 : rewards[j];
    EXPECT(fabs(adv[i] - (rewards[i] - others / (G - 1))) < 1e-6);
    printf(" %.6f", adv[i]);
  }
  printf("\n");

  /* 2. Log-probs: the trainer's (logp, logp_old) and the inference engine's (logp_rollout),
   * which drifts from logp_old by up to 1.2 nats; every fifth token is padding. */
  uint32_t seq[N + 1];
  float logp[T], old[T], roll[T], weights[T], grad[T], grad_same[T];
  uint8_t mask[T], keep[T];
  for (int i = 0; i <= N; i++) seq[i] = (uint32_t)(i * L);
  for (int t = 0; t < T; t++) {
    old[t] = -0.4f - 0.1f * (float)(t % 7);
    logp[t] = old[t] + 0.15f * (float)(t % 3 - 1);
    roll[t] = old[t] + 0.3f * (float)((t * 5) % 9 - 4);
    mask[t] = t % 5 != 4;
  }

  /* 3. The rollout correction: token weights min(exp(old - roll), 1.5), rejecting a token whose
   * ratio leaves [0.5, 2]. */
  care_loss_options lo;
  CHECK(care_loss_options_preset(CARE_LOSS_PRESET_VERL, &lo));
  lo.policy_loss = CARE_POLICY_LOSS_CISPO;
  lo.rollout.is_level = CARE_IS_TOKEN;
  lo.rollout.is_threshold = IS_CAP;
  lo.rollout.reject[CARE_REJECT_TOKEN_K1] = (care_reject_bound){0.5, 2.0};
  care_loss_inputs li = {sizeof li, CARE_DTYPE_F32, logp, T, old, T, NULL, 0, seq, N + 1,
                         mask, T, adv, N, CARE_ADVANTAGES_PER_SEQUENCE, L, roll, T};
  care_rollout_stats rs;
  CHECK(care_rollout_correction(&li, &lo, weights, T, keep, T, &rs));
  int counted = 0, rejected = 0;
  for (int t = 0; t < T; t++) {
    double ratio = exp((double)old[t] - (double)roll[t]);
    int in = mask[t] && ratio >= 0.5 && ratio <= 2.0;
    EXPECT(keep[t] == in);
    EXPECT(fabs(weights[t] - (in ? fmin(ratio, IS_CAP) : 0.0)) < 1e-5);
    counted += mask[t];
    rejected += mask[t] && !in;
  }
  EXPECT(rs.tokens == counted && rs.rejected_tokens == rejected && rejected > 0);
  printf("rollout: tokens %.0f rejected %.0f truncated %.0f mean weight %.6f kl %.6f\n", rs.tokens,
         rs.rejected_tokens, rs.truncated, rs.weight_sum / rs.tokens, rs.kl_sum / rs.tokens);

  /* 4. The CISPO loss with the correction, and the identity: rollout log-probs equal to
   * logp_old give weight 1 everywhere and the loss without correction, bit for bit. */
  double loss, loss_same, loss_plain;
  care_loss_stats st;
  CHECK(care_policy_loss(&li, &lo, grad, T, &loss, &st));
  care_loss_inputs same = li, plain = li;
  same.logp_rollout = old;
  plain.logp_rollout = NULL;
  plain.logp_rollout_len = 0;
  CHECK(care_policy_loss(&same, &lo, grad_same, T, &loss_same, NULL));
  CHECK(care_policy_loss(&plain, &lo, grad, T, &loss_plain, NULL));
  EXPECT(loss_same == loss_plain && loss != loss_plain);
  CHECK(care_policy_loss(&li, &lo, grad, T, &loss, &st)); /* grad: the corrected one again */
  printf("cispo loss: %.6f (uncorrected %.6f) tokens %.0f\n", loss, loss_plain, st.tokens);

  /* KL-Cov with the correction: the quarter of the counted tokens with the largest
   * covariance of advantage and log-prob gets |log ratio| on top. On the GPU its selection
   * needs a workspace that grows with the tokens. */
  care_loss_options klo = lo;
  klo.policy_loss = CARE_POLICY_LOSS_KL_COV;
  klo.cov_ratio = 0.25;
  double loss_kl;
  CHECK(care_policy_loss(&li, &klo, grad_same, T, &loss_kl, NULL));
  size_t ws_kl = 0;
  CHECK(care_gpu_policy_loss_workspace_bytes(&klo, T, &ws_kl));
  EXPECT(ws_kl >= CARE_GPU_WORKSPACE_BYTES + 8 * T && loss_kl != loss);
  printf("kl_cov loss: %.6f (device workspace %zu bytes)\n", loss_kl, ws_kl);

  /* 5. The same step on the GPU: care_gpu_policy_loss_into also accumulates the rollout
   * diagnostics into a device struct, read back as the CPU's care_rollout_stats. */
  if (care_gpu_available() != CARE_OK || !cuda_open()) {
    printf("gpu: none (CPU checks only)\n");
    return 0;
  }
  CUdeviceptr d[] = {to_device(logp, sizeof logp), to_device(old, sizeof old),
                     to_device(roll, sizeof roll), to_device(seq, sizeof seq),
                     to_device(mask, sizeof mask), to_device(adv, sizeof adv),
                     to_device(NULL, CARE_GPU_LOSS_STATS_BYTES),
                     to_device(NULL, CARE_GPU_ROLLOUT_STATS_BYTES),
                     to_device(NULL, CARE_GPU_WORKSPACE_BYTES)};
  care_loss_inputs d_li = li;
  d_li.logp = DEV(d[0]);
  d_li.logp_old = DEV(d[1]);
  d_li.logp_rollout = DEV(d[2]);
  d_li.seq_offsets = DEV(d[3]);
  d_li.mask = DEV(d[4]);
  d_li.advantages = DEV(d[5]);
  care_gpu_loss_outputs out = {sizeof out, CARE_DTYPE_F32, NULL, 0,
                               DEV(d[6]), CARE_GPU_LOSS_STATS_BYTES,
                               DEV(d[7]), CARE_GPU_ROLLOUT_STATS_BYTES};
  care_gpu_launch launch = {sizeof launch, NULL, DEV(d[8]), CARE_GPU_WORKSPACE_BYTES};
  CHECK(care_gpu_loss_stats_reset(out.stats, out.stats_len, &launch));
  CHECK(care_gpu_rollout_stats_reset(out.rollout_stats, out.rollout_stats_len, &launch));
  CHECK(care_gpu_policy_loss_into(&d_li, &lo, &out, &launch));
  care_loss_stats gst;
  care_rollout_stats grs;
  CHECK(care_gpu_loss_stats_read(out.stats, out.stats_len, &launch, &gst));
  CHECK(care_gpu_rollout_stats_read(out.rollout_stats, out.rollout_stats_len, &launch, &grs));
  printf("gpu loss %.6f rollout tokens %.0f rejected %.0f mean weight %.6f\n", gst.loss,
         grs.tokens, grs.rejected_tokens, grs.weight_sum / grs.tokens);
  EXPECT(fabs(gst.loss - loss) <= 1e-4 && grs.tokens == rs.tokens);
  EXPECT(grs.rejected_tokens == rs.rejected_tokens && grs.truncated == rs.truncated);
  EXPECT(fabs(grs.weight_sum - rs.weight_sum) <= 1e-4 * rs.tokens);

  /* 6. KL-Cov on the GPU: the CARE_GPU_WORKSPACE_BYTES workspace is too small for its
   * selection (a detail says how much is needed); the sized one works. */
  EXPECT(care_gpu_policy_loss_into(&d_li, &klo, &out, &launch) == CARE_ERR_BUFFER_TOO_SMALL);
  CUdeviceptr d_ws_kl = to_device(NULL, ws_kl);
  care_gpu_launch launch_kl = {sizeof launch_kl, NULL, DEV(d_ws_kl), ws_kl};
  CHECK(care_gpu_loss_stats_reset(out.stats, out.stats_len, &launch));
  CHECK(care_gpu_policy_loss_into(&d_li, &klo, &out, &launch_kl));
  CHECK(care_gpu_loss_stats_read(out.stats, out.stats_len, &launch, &gst));
  printf("gpu kl_cov loss %.6f\n", gst.loss);
  EXPECT(fabs(gst.loss - loss_kl) <= 1e-4);
  cu.mem_free(d_ws_kl);
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cu.mem_free(d[i]);
  return 0;
}
