/* A GRPO step through the C API of libcare:
 *   parse a rubric -> render a judge prompt -> parse judge answers -> score the group ->
 *   group advantages -> clipped-ratio loss and gradient (CPU, and GPU when one is present).
 * Usage: grpo_step RUBRIC.json
 * The printed numbers are compared in CI with `cargo run -p care-ffi --example reference`,
 * which computes the same step with the Rust API (lines starting with "gpu" are not compared).
 * With a CUDA driver and device, the advantages and the loss also run on the GPU: device memory
 * comes from the driver API (loaded with dlopen, so no CUDA toolkit is needed to build). */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "care.h"

#define G 4         /* responses per prompt */
#define B 2         /* prompts */
#define N (B * G)   /* responses */

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

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) { perror(path); exit(1); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "read %s\n", path); exit(1); }
  fclose(f);
  *len = (size_t)n;
  return buf;
}


/* ---- The few CUDA driver calls the GPU part needs, loaded at run time. ------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;

static struct {
  CUresult (*init)(unsigned);
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*htod)(CUdeviceptr, const void *, size_t);
  CUresult (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

/* dlsym returns an object pointer; copying its bytes into a function pointer is the POSIX way
 * that ISO C's -Wpedantic accepts. */
static int load_sym(void *lib, const char *name, void *fn, size_t fn_size) {
  void *sym = dlsym(lib, name);
  if (!sym) return 0;
  memcpy(fn, &sym, fn_size);
  return 1;
}

static int cuda_open(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  int ok = load_sym(lib, "cuInit", &cu.init, sizeof cu.init) &&
           load_sym(lib, "cuDeviceGet", &cu.device_get, sizeof cu.device_get) &&
           load_sym(lib, "cuDevicePrimaryCtxRetain", &cu.primary_ctx_retain, sizeof cu.primary_ctx_retain) &&
           load_sym(lib, "cuCtxSetCurrent", &cu.ctx_set_current, sizeof cu.ctx_set_current) &&
           load_sym(lib, "cuMemAlloc_v2", &cu.mem_alloc, sizeof cu.mem_alloc) &&
           load_sym(lib, "cuMemFree_v2", &cu.mem_free, sizeof cu.mem_free) &&
           load_sym(lib, "cuMemcpyHtoD_v2", &cu.htod, sizeof cu.htod) &&
           load_sym(lib, "cuMemcpyDtoH_v2", &cu.dtoh, sizeof cu.dtoh);
  CUdevice dev;
  CUcontext ctx;
  return ok && cu.init(0) == 0 && cu.device_get(&dev, 0) == 0 &&
         cu.primary_ctx_retain(&ctx, dev) == 0 && cu.ctx_set_current(ctx) == 0;
}

/* A device copy of `bytes` bytes of `host` (or zeroed-by-copy scratch when host is NULL). */
static CUdeviceptr to_device(const void *host, size_t bytes) {
  CUdeviceptr d = 0;
  if (cu.mem_alloc(&d, bytes ? bytes : 1) != 0) { fprintf(stderr, "gpu: cuMemAlloc failed\n"); exit(1); }
  if (host && cu.htod(d, host, bytes) != 0) { fprintf(stderr, "gpu: copy failed\n"); exit(1); }
  return d;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
  return m;
}

static const char *const DIM_NAMES[3] = {"Cognitive Empathy", "Affective Empathy", "Proactive Empathy"};

/* The judge answer for response j: score of flat criterion k is (5j + 2k + jk mod 3 + 1) mod 6. Odd
 * responses wrap it in a think block and a code fence, as reasoning judges do. */
static size_t judge_answer(const care_rubric *rubric, int j, char *out, size_t cap) {
  size_t counts[3], len = 0;
  CHECK(care_rubric_criteria_counts(rubric, counts, 3));
  len += (size_t)snprintf(out + len, cap - len, "%s{\"criterion_scores\":[",
                          (j % 2) ? "<think>weighing the criteria</think>\n```json\n" : "");
  int k = 0;
  for (uint32_t d = 0; d < 3; d++) {
    for (size_t i = 0; i < counts[d]; i++, k++) {
      const char *title, *desc;
      size_t title_len, desc_len;
      CHECK(care_rubric_criterion(rubric, d, i, &title, &title_len, &desc, &desc_len));
      len += (size_t)snprintf(out + len, cap - len,
                              "%s{\"category\":\"%s\",\"criterion_title\":\"%.*s\",\"score\":%d}",
                              k ? "," : "", DIM_NAMES[d], (int)title_len, title,
                              (5 * j + 2 * k + (j * k) % 3 + 1) % 6);
    }
  }
  len += (size_t)snprintf(out + len, cap - len, "]}%s", (j % 2) ? "\n```" : "");
  return len;
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s RUBRIC.json\n", argv[0]); return 2; }
  if (care_abi_version() != CARE_ABI_VERSION) { fprintf(stderr, "ABI mismatch\n"); return 1; }
  printf("care abi %u\n", (unsigned)care_abi_version());

  /* 1. The rubric: parsed once, shared by every response of the batch. */
  size_t json_len;
  char *json = read_file(argv[1], &json_len);
  const care_rubric *rubric = NULL;
  CHECK(care_rubric_parse(json, json_len, NULL, &rubric));
  double w[3];
  size_t counts[3], total;
  CHECK(care_rubric_weights(rubric, w, 3));
  CHECK(care_rubric_criteria_counts(rubric, counts, 3));
  CHECK(care_rubric_total_criteria(rubric, &total));
  printf("rubric: weights %.6f %.6f %.6f criteria %zu %zu %zu\n", w[0], w[1], w[2], counts[0],
         counts[1], counts[2]);

  /* 2. The judge prompt: ask for the size, then render. */
  const char *ctx[] = {"Seeker: I reconnected with an old friend but it feels strange."};
  size_t ctx_len[] = {strlen(ctx[0])};
  const char *seeker = "Should I just tell her how I feel?";
  const char *resp = "It makes sense that this feels awkward. What would you like her to know?";
  care_judge_prompt_inputs dialogue = {sizeof dialogue, ctx, ctx_len, 1, seeker, strlen(seeker),
                                       resp, strlen(resp)};
  size_t need = 0;
  care_result r = care_judge_prompt_render(rubric, &dialogue, NULL, 0, &need);
  if (r != CARE_ERR_BUFFER_TOO_SMALL) CHECK(r);
  char *prompt = malloc(need);
  size_t prompt_len = 0;
  CHECK(care_judge_prompt_render(rubric, &dialogue, prompt, need, &prompt_len));
  printf("judge prompt: %zu bytes\n", prompt_len);
  free(prompt);

  /* 3. Judge answers -> scores -> policy rewards of the whole batch in one call. */
  double *scores = malloc(N * total * sizeof(double));
  char answer[8192];
  for (int j = 0; j < N; j++) {
    size_t alen = judge_answer(rubric, j, answer, sizeof answer);
    care_judge_report jr;
    CHECK(care_judge_output_parse(rubric, answer, alen, scores + (size_t)j * total, total, &jr));
    if (jr.matched != total) { fprintf(stderr, "judge matched %u\n", jr.matched); return 1; }
  }
  double rewards[N];
  care_group_report br;
  CHECK(care_policy_reward_group(rubric, scores, N * total, NULL, rewards, N, &br));
  printf("rewards:");
  for (int j = 0; j < N; j++) printf(" %.6f", rewards[j]);
  printf(" (scored %u)\n", br.scored);

  /* 4. Group advantages (verl preset), float rewards as trainers hold them. */
  float rf[N], adv[N];
  for (int j = 0; j < N; j++) rf[j] = (float)rewards[j];
  care_advantage_options ao;
  CHECK(care_advantage_options_preset_by_name("verl", 4, &ao));
  care_group_stats gs[B];
  /* all samples valid; no lengths or baselines (only the OPO and ReMax baselines read them) */
  care_rewards batch = {sizeof batch, rf, N, NULL, 0, NULL, 0, NULL, 0};
  care_group_layout groups = {sizeof groups, G, NULL, 0};         /* B groups of G */
  care_advantage_outputs aout = {sizeof aout, adv, N, gs, B};
  CHECK(care_group_advantages(&batch, &groups, &ao, &aout));
  printf("advantages:");
  for (int j = 0; j < N; j++) printf(" %.6f", adv[j]);
  printf("\n");
  for (int b = 0; b < B; b++) printf("group %d: mean %.6f std %.6f\n", b, gs[b].mean, gs[b].std);

  /* 5. One loss step: sequence j has 3 + j % 4 tokens; every fifth token is padding. */
  uint32_t seq[N + 1];
  seq[0] = 0;
  for (int j = 0; j < N; j++) seq[j + 1] = seq[j] + 3 + (uint32_t)(j % 4);
  size_t T = seq[N];
  float *logp = malloc(T * sizeof(float)), *old = malloc(T * sizeof(float));
  float *grad = malloc(T * sizeof(float));
  uint8_t *mask = malloc(T);
  for (size_t t = 0; t < T; t++) {
    logp[t] = -0.5f - 0.1f * (float)((t * 7) % 5);
    old[t] = logp[t] + 0.3f * (float)((int)(t % 3) - 1);
    mask[t] = (t % 5) != 4;
  }
  care_loss_options lo;
  CHECK(care_loss_options_preset(CARE_LOSS_PRESET_VERL, &lo));
  double loss;
  care_loss_stats st;
  care_loss_inputs li = {sizeof li, CARE_DTYPE_F32, logp, T, old, T, NULL, 0, seq, N + 1,
                         mask, T, adv, N, CARE_ADVANTAGES_PER_SEQUENCE, 0,
                         NULL, 0 /* no rollout log-probs: no rollout correction */};
  CHECK(care_policy_loss(&li, &lo, grad, T, &loss, &st));
  printf("loss: %.6f tokens %.0f clipped %.0f ratio %.6f..%.6f\n", loss, st.tokens, st.clipped,
         st.ratio_min, st.ratio_max);
  printf("grad:");
  for (size_t t = 0; t < T; t++) printf(" %.6f", grad[t]);
  printf("\n");

  /* 6. The same step on the GPU when a driver and device are present: device buffers, the
   * legacy default stream (NULL), asynchronous launches, then the status and stats read-backs. */
  care_result gpu = care_gpu_available();
  if (gpu != CARE_OK || !cuda_open()) {
    printf("gpu: %s\n", gpu == CARE_OK ? "driver API not loadable" : care_result_message(gpu));
  } else {
    CUdeviceptr d_r = to_device(rf, sizeof rf), d_adv = to_device(NULL, sizeof adv);
    CUdeviceptr d_ws = to_device(NULL, CARE_GPU_WORKSPACE_BYTES);
    /* The CPU structs again, with device addresses; NULL stream = the legacy default stream. */
    care_gpu_launch launch = {sizeof launch, NULL, (void *)(uintptr_t)d_ws, CARE_GPU_WORKSPACE_BYTES};
    care_rewards d_batch = batch;
    d_batch.rewards = (const float *)(uintptr_t)d_r;
    care_advantage_outputs d_aout = {sizeof d_aout, (float *)(uintptr_t)d_adv, N, NULL, 0};
    CHECK(care_gpu_group_advantages(&d_batch, &groups, &ao, &d_aout, NULL, &launch));
    CHECK(care_gpu_group_advantages_status(&launch));
    float gadv[N];
    cu.dtoh(gadv, d_adv, sizeof gadv);
    double adv_diff = max_abs_diff(gadv, adv, N);
    printf("gpu advantages: max |gpu - cpu| %.3g\n", adv_diff);

    CUdeviceptr d_logp = to_device(logp, T * sizeof(float)), d_old = to_device(old, T * sizeof(float));
    CUdeviceptr d_seq = to_device(seq, sizeof seq), d_mask = to_device(mask, T);
    CUdeviceptr d_grad = to_device(NULL, T * sizeof(float));
    CUdeviceptr d_stats = to_device(NULL, CARE_GPU_LOSS_STATS_BYTES);
    care_loss_inputs d_li = li;
    d_li.logp = (const void *)(uintptr_t)d_logp;
    d_li.logp_old = (const void *)(uintptr_t)d_old;
    d_li.seq_offsets = (const uint32_t *)(uintptr_t)d_seq;
    d_li.mask = (const uint8_t *)(uintptr_t)d_mask;
    d_li.advantages = (const float *)(uintptr_t)d_adv;
    CHECK(care_gpu_loss_stats_reset((void *)(uintptr_t)d_stats, CARE_GPU_LOSS_STATS_BYTES, &launch));
    CHECK(care_gpu_policy_loss(&d_li, &lo, (void *)(uintptr_t)d_grad, T, CARE_DTYPE_F32,
                               (void *)(uintptr_t)d_stats, CARE_GPU_LOSS_STATS_BYTES, &launch));
    care_loss_stats gst;
    CHECK(care_gpu_loss_stats_read((const void *)(uintptr_t)d_stats, CARE_GPU_LOSS_STATS_BYTES, &launch, &gst));
    float *ggrad = malloc(T * sizeof(float));
    cu.dtoh(ggrad, d_grad, T * sizeof(float));
    printf("gpu loss: %.6f (cpu %.6f) tokens %.0f max |grad diff| %.3g\n", gst.loss, loss,
           gst.tokens, max_abs_diff(ggrad, grad, T));
    /* Well inside the kernels' tolerance table for these magnitudes (README, CUDA kernels). */
    int close = adv_diff <= 1e-4 && fabs(gst.loss - loss) <= 1e-4 && max_abs_diff(ggrad, grad, T) <= 1e-4;
    free(ggrad);
    if (!close) { fprintf(stderr, "gpu: results differ from the CPU\n"); return 1; }
    CUdeviceptr all[] = {d_r, d_adv, d_ws, d_logp, d_old, d_seq, d_mask, d_grad, d_stats};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) cu.mem_free(all[i]);
  }

  free(scores);
  free(logp);
  free(old);
  free(grad);
  free(mask);
  free(json);
  care_rubric_free(rubric);
  return 0;
}
