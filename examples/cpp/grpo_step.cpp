// The GRPO step of examples/c/grpo_step.c, written as a C++ trainer would, with the RAII
// wrappers of care.hpp. Prints exactly what the C example prints (CI compares both with the
// Rust API). Usage: grpo_step_cpp RUBRIC.json
#include <cstdio>
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

  care_batch_report br{};
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

  care_result gpu = care_gpu_available();
  std::printf("gpu: %s\n", gpu == CARE_OK ? "available" : care_result_message(gpu));
  return 0;
} catch (const care::Error &e) {
  std::fprintf(stderr, "%s (code %u)\n", e.what(), static_cast<unsigned>(e.code()));
  return 1;
} catch (const std::exception &e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
