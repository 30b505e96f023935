// The GRPO step of examples/c/grpo_step.c, written as a C++ trainer would, with the RAII
// wrappers of care.hpp. Prints exactly what the C example prints (CI compares both with the
// Rust API). With a CUDA driver and device, the advantages and the loss also run on the GPU.
// Usage: grpo_step RUBRIC.json
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "care.hpp"

namespace {

constexpr int G = 4;  // responses per prompt
constexpr int B = 2;  // prompts
constexpr int N = B * G;

// ---- The few CUDA driver calls the GPU part needs, loaded at run time (no toolkit needed). --
using CUdeviceptr = unsigned long long;
struct CudaDriver {
  int (*init)(unsigned) = nullptr;
  int (*device_get)(int *, int) = nullptr;
  int (*primary_ctx_retain)(void **, int) = nullptr;
  int (*ctx_set_current)(void *) = nullptr;
  int (*mem_alloc)(CUdeviceptr *, std::size_t) = nullptr;
  int (*mem_free)(CUdeviceptr) = nullptr;
  int (*htod)(CUdeviceptr, const void *, std::size_t) = nullptr;
  int (*dtoh)(void *, CUdeviceptr, std::size_t) = nullptr;

  template <class F>
  static bool sym(void *lib, const char *name, F &fn) {
    void *p = dlsym(lib, name);
    if (!p) return false;
    std::memcpy(&fn, &p, sizeof fn);  // object -> function pointer, as POSIX allows
    return true;
  }
  bool open() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    bool ok = sym(lib, "cuInit", init) && sym(lib, "cuDeviceGet", device_get) &&
              sym(lib, "cuDevicePrimaryCtxRetain", primary_ctx_retain) &&
              sym(lib, "cuCtxSetCurrent", ctx_set_current) && sym(lib, "cuMemAlloc_v2", mem_alloc) &&
              sym(lib, "cuMemFree_v2", mem_free) && sym(lib, "cuMemcpyHtoD_v2", htod) &&
              sym(lib, "cuMemcpyDtoH_v2", dtoh);
    int dev = 0;
    void *ctx = nullptr;
    return ok && init(0) == 0 && device_get(&dev, 0) == 0 && primary_ctx_retain(&ctx, dev) == 0 &&
           ctx_set_current(ctx) == 0;
  }
};

/// A device buffer owned RAII-style, filled from host data (or uninitialized).
class DeviceBuffer {
 public:
  DeviceBuffer(const CudaDriver &cu, const void *host, std::size_t bytes) : cu_(cu) {
    if (cu_.mem_alloc(&ptr_, bytes ? bytes : 1) != 0) throw std::runtime_error("cuMemAlloc");
    if (host && cu_.htod(ptr_, host, bytes) != 0) throw std::runtime_error("cuMemcpyHtoD");
  }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() { cu_.mem_free(ptr_); }
  template <class T>
  T *as() const { return reinterpret_cast<T *>(static_cast<std::uintptr_t>(ptr_)); }
  template <class T>
  std::vector<T> read(std::size_t n) const {
    std::vector<T> v(n);
    if (cu_.dtoh(v.data(), ptr_, n * sizeof(T)) != 0) throw std::runtime_error("cuMemcpyDtoH");
    return v;
  }

 private:
  const CudaDriver &cu_;
  CUdeviceptr ptr_ = 0;
};

template <class T>
double max_abs_diff(const std::vector<T> &a, const std::vector<T> &b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); i++)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

const char *const kDimNames[3] = {"Cognitive Empathy", "Affective Empathy", "Proactive Empathy"};

std::string judge_answer(const care::Rubric &rubric, int j) {
  std::string s = (j % 2) ? "<think>weighing the criteria</think>\n```json\n" : "";
  s += "{\"criterion_scores\":[";
  auto counts = rubric.criteria_counts();
  int k = 0;
  for (uint32_t d = 0; d < 3; d++) {
    for (std::size_t i = 0; i < counts[d]; i++, k++) {
      auto [title, desc] = rubric.criterion(static_cast<care_dimension>(d), i);
      (void)desc;
      if (k) s += ",";
      s += "{\"category\":\"" + std::string(kDimNames[d]) + "\",\"criterion_title\":\"" +
           std::string(title) + "\",\"score\":" + std::to_string((5 * j + 2 * k + (j * k) % 3 + 1) % 6) +
           "}";
    }
  }
  s += "]}";
  if (j % 2) s += "\n```";
  return s;
}

}  // namespace

int main(int argc, char **argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s RUBRIC.json\n", argv[0]);
    return 2;
  }
  std::printf("care abi %u\n", static_cast<unsigned>(care_abi_version()));
  std::ifstream in(argv[1], std::ios::binary);
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in) throw std::runtime_error("cannot read rubric");

  auto report = care::ValidationReport::validate(json);
  if (report.size() != 0) {
    for (std::size_t i = 0; i < report.size(); i++) std::fprintf(stderr, "%s\n", report.message(i).c_str());
    return 1;
  }
  const care::Rubric rubric = care::Rubric::parse(json);
  auto w = rubric.weights();
  auto c = rubric.criteria_counts();
  std::printf("rubric: weights %.6f %.6f %.6f criteria %zu %zu %zu\n", w[0], w[1], w[2], c[0], c[1],
              c[2]);

  std::string prompt = rubric.judge_prompt(
      {"Seeker: I reconnected with an old friend but it feels strange."},
      "Should I just tell her how I feel?",
      "It makes sense that this feels awkward. What would you like her to know?");
  std::printf("judge prompt: %zu bytes\n", prompt.size());

  // Judge answers are parsed on worker threads, each holding its own copy of the rubric
  // (a shared, reference-counted handle), as a trainer's reward workers would.
  std::size_t total = rubric.total_criteria();
  std::vector<double> scores(N * total);
  std::vector<std::thread> workers;
  for (int j = 0; j < N; j++) {
    workers.emplace_back([r = rubric, j, total, &scores] {
      auto s = r.parse_judge(judge_answer(r, j));
      std::copy(s.begin(), s.end(), scores.begin() + static_cast<std::ptrdiff_t>(j * total));
    });
  }
  for (auto &t : workers) t.join();

  care_group_report br{};
  std::vector<double> rewards = rubric.policy_rewards(scores, nullptr, &br);
  std::printf("rewards:");
  for (double r : rewards) std::printf(" %.6f", r);
  std::printf(" (scored %u)\n", br.scored);

  std::vector<float> rf(rewards.begin(), rewards.end());
  auto opts = care::advantage_preset("verl");
  std::vector<care_group_stats> gs;
  std::vector<float> adv = care::group_advantages(rf, G, &opts, &gs);
  std::printf("advantages:");
  for (float a : adv) std::printf(" %.6f", a);
  std::printf("\n");
  for (std::size_t b = 0; b < gs.size(); b++)
    std::printf("group %zu: mean %.6f std %.6f\n", b, gs[b].mean, gs[b].std);

  std::vector<uint32_t> seq{0};
  for (int j = 0; j < N; j++) seq.push_back(seq.back() + 3 + static_cast<uint32_t>(j % 4));
  std::size_t T = seq.back();
  std::vector<float> logp(T), old(T);
  std::vector<uint8_t> mask(T);
  for (std::size_t t = 0; t < T; t++) {
    logp[t] = -0.5f - 0.1f * static_cast<float>((t * 7) % 5);
    old[t] = logp[t] + 0.3f * static_cast<float>(static_cast<int>(t % 3) - 1);
    mask[t] = (t % 5) != 4;
  }
  care_loss_options lo{};
  care::check(care_loss_options_preset(CARE_LOSS_PRESET_VERL, &lo));
  care::LossResult l = care::policy_loss(logp, old, seq, mask, adv, &lo);
  std::printf("loss: %.6f tokens %.0f clipped %.0f ratio %.6f..%.6f\n", l.loss, l.stats.tokens,
              l.stats.clipped, l.stats.ratio_min, l.stats.ratio_max);
  std::printf("grad:");
  for (float g : l.grad) std::printf(" %.6f", g);
  std::printf("\n");

  // The same advantages and loss on the GPU when a driver and device are present (legacy
  // default stream: nullptr; a trainer passes its CUstream, e.g. torch's current stream).
  care_result gpu = care_gpu_available();
  CudaDriver cu;
  if (gpu != CARE_OK || !cu.open()) {
    std::printf("gpu: %s\n", gpu == CARE_OK ? "driver API not loadable" : care_result_message(gpu));
  } else {
    DeviceBuffer d_r(cu, rf.data(), rf.size() * sizeof(float)), d_adv(cu, nullptr, N * sizeof(float));
    DeviceBuffer d_ws(cu, nullptr, CARE_GPU_WORKSPACE_BYTES);
    // The structs of the CPU calls, with device addresses.
    care_gpu_launch launch{sizeof launch, nullptr, d_ws.as<void>(), CARE_GPU_WORKSPACE_BYTES};
    care_rewards batch{sizeof batch, d_r.as<const float>(), N, nullptr, 0, nullptr, 0, nullptr, 0};
    care_group_layout groups{sizeof groups, G, nullptr, 0};
    care_advantage_outputs aout{sizeof aout, d_adv.as<float>(), N, nullptr, 0};
    care::check(care_gpu_group_advantages(&batch, &groups, &opts, &aout, nullptr, &launch));
    care::check(care_gpu_group_advantages_status(&launch));
    double adv_diff = max_abs_diff(d_adv.read<float>(N), adv);
    std::printf("gpu advantages: max |gpu - cpu| %.3g\n", adv_diff);

    DeviceBuffer d_logp(cu, logp.data(), T * sizeof(float)), d_old(cu, old.data(), T * sizeof(float));
    DeviceBuffer d_seq(cu, seq.data(), seq.size() * sizeof(uint32_t)), d_mask(cu, mask.data(), T);
    DeviceBuffer d_grad(cu, nullptr, T * sizeof(float)), d_stats(cu, nullptr, CARE_GPU_LOSS_STATS_BYTES);
    care_loss_inputs in{};
    in.struct_size = sizeof in;
    in.dtype = CARE_DTYPE_F32;
    in.logp = d_logp.as<const void>();
    in.logp_len = T;
    in.logp_old = d_old.as<const void>();
    in.logp_old_len = T;
    in.seq_offsets = d_seq.as<const uint32_t>();
    in.seq_offsets_len = seq.size();
    in.mask = d_mask.as<const uint8_t>();
    in.mask_len = T;
    in.advantages = d_adv.as<const float>();
    in.advantages_len = N;
    in.advantages_kind = CARE_ADVANTAGES_PER_SEQUENCE;
    care::check(care_gpu_loss_stats_reset(d_stats.as<void>(), CARE_GPU_LOSS_STATS_BYTES, &launch));
    care::check(care_gpu_policy_loss(&in, &lo, d_grad.as<void>(), T, CARE_DTYPE_F32,
                                     d_stats.as<void>(), CARE_GPU_LOSS_STATS_BYTES, &launch));
    care_loss_stats gst{};
    care::check(care_gpu_loss_stats_read(d_stats.as<const void>(), CARE_GPU_LOSS_STATS_BYTES, &launch, &gst));
    double grad_diff = max_abs_diff(d_grad.read<float>(T), l.grad);
    std::printf("gpu loss: %.6f (cpu %.6f) tokens %.0f max |grad diff| %.3g\n", gst.loss, l.loss,
                gst.tokens, grad_diff);
    // Well inside the kernels' tolerance table for these magnitudes (README, CUDA kernels).
    if (adv_diff > 1e-4 || std::fabs(gst.loss - l.loss) > 1e-4 || grad_diff > 1e-4) {
      std::fprintf(stderr, "gpu: results differ from the CPU\n");
      return 1;
    }
  }
  return 0;
} catch (const care::Error &e) {
  std::fprintf(stderr, "%s (code %u)\n", e.what(), static_cast<unsigned>(e.code()));
  return 1;
} catch (const std::exception &e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
