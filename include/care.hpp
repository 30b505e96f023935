// care.hpp: header-only C++17 RAII wrappers over the C API of libcare (include/care.h).
//
// * care::Error        - a std::runtime_error carrying the care_result code.
// * care::Rubric       - a parsed rubric; copies share one immutable handle (care_rubric_clone),
//                        so a Rubric can be handed to worker threads by value.
// * care::ValidationReport - the format-contract report (move-only, freed on destruction).
// * free functions     - advantages and the policy loss over std::vector, for trainers.
//
// Every call checks its care_result and throws care::Error on failure; nothing leaks on the
// throwing path because each handle is owned by an object the moment it exists.
#ifndef CARE_HPP
#define CARE_HPP

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "care.h"

namespace care {

/// The calling thread's detail of its last failed libcare call (which field, what to fix).
inline std::string last_error_detail() {
  std::string text(1024, '\0');
  size_t n = 0;
  if (care_last_error_detail(text.data(), text.size(), &n) != CARE_OK) return {};
  text.resize(n);
  return text;
}

/// A failed libcare call: the code, its message and the call's detail.
class Error : public std::runtime_error {
 public:
  explicit Error(care_result code)
      : std::runtime_error(std::string("care: ") + care_result_message(code) + ": " +
                           last_error_detail()),
        code_(code) {}
  care_result code() const noexcept { return code_; }

 private:
  care_result code_;
};

/// Throws care::Error unless `r` is CARE_OK.
inline void check(care_result r) {
  if (r != CARE_OK) throw Error(r);
}

/// The format-contract report of a rubric text.
class ValidationReport {
 public:
  static ValidationReport validate(std::string_view json,
                                   const care_format_policy *policy = nullptr) {
    care_validation_report *r = nullptr;
    check(care_rubric_validate(json.data(), json.size(), policy, &r));
    return ValidationReport(r);
  }
  ValidationReport(ValidationReport &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  ValidationReport &operator=(ValidationReport &&o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ValidationReport(const ValidationReport &) = delete;
  ValidationReport &operator=(const ValidationReport &) = delete;
  ~ValidationReport() { care_validation_report_free(h_); }

  std::size_t size() const {
    std::size_t n = 0;
    check(care_validation_report_count(h_, &n));
    return n;
  }
  care_violation at(std::size_t i) const {
    care_violation v{};
    check(care_validation_report_violation(h_, i, &v));
    return v;
  }
  /// The one-line message of violation `i`, ready for a retry prompt.
  std::string message(std::size_t i) const {
    std::size_t need = 0;
    care_result r = care_validation_report_message(h_, i, nullptr, 0, &need);
    if (r != CARE_ERR_BUFFER_TOO_SMALL) check(r);
    std::string s(need, '\0');
    check(care_validation_report_message(h_, i, s.data(), s.size(), &need));
    return s;
  }
  double r_fmt() const {
    double f = 0;
    uint32_t parsed = 0, overflowed = 0;
    check(care_validation_report_summary(h_, &f, &parsed, &overflowed));
    return f;
  }

 private:
  explicit ValidationReport(care_validation_report *h) : h_(h) {}
  care_validation_report *h_;
};

/// A parsed rubric. Immutable; copies share the handle and may be used from any thread.
class Rubric {
 public:
  static Rubric parse(std::string_view json, const care_format_policy *policy = nullptr) {
    const care_rubric *r = nullptr;
    check(care_rubric_parse(json.data(), json.size(), policy, &r));
    return Rubric(r);
  }
  Rubric(const Rubric &o) : h_(nullptr) { check(care_rubric_clone(o.h_, &h_)); }
  Rubric &operator=(const Rubric &o) {
    if (this != &o) {
      Rubric copy(o);
      std::swap(h_, copy.h_);
    }
    return *this;
  }
  Rubric(Rubric &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Rubric &operator=(Rubric &&o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~Rubric() { care_rubric_free(h_); }

  const care_rubric *get() const noexcept { return h_; }

  std::array<double, 3> weights() const {
    std::array<double, 3> w{};
    check(care_rubric_weights(h_, w.data(), w.size()));
    return w;
  }
  std::array<std::size_t, 3> criteria_counts() const {
    std::array<std::size_t, 3> c{};
    check(care_rubric_criteria_counts(h_, c.data(), c.size()));
    return c;
  }
  std::size_t total_criteria() const {
    std::size_t n = 0;
    check(care_rubric_total_criteria(h_, &n));
    return n;
  }
  /// Title and description of criterion `i` of dimension `d`; views live as long as the rubric.
  std::pair<std::string_view, std::string_view> criterion(care_dimension d, std::size_t i) const {
    const char *t = nullptr, *desc = nullptr;
    std::size_t tl = 0, dl = 0;
    check(care_rubric_criterion(h_, d, i, &t, &tl, &desc, &dl));
    return {std::string_view(t, tl), std::string_view(desc, dl)};
  }

  /// The judge prompt for one candidate response.
  std::string judge_prompt(const std::vector<std::string_view> &context, std::string_view seeker,
                           std::string_view response) const {
    std::vector<const char *> ptrs;
    std::vector<std::size_t> lens;
    for (auto c : context) {
      ptrs.push_back(c.data());
      lens.push_back(c.size());
    }
    care_judge_prompt_inputs in{sizeof in, ptrs.data(), lens.data(), ptrs.size(),
                                seeker.data(), seeker.size(), response.data(), response.size()};
    std::size_t need = 0;
    care_result r = care_judge_prompt_render(h_, &in, nullptr, 0, &need);
    if (r != CARE_ERR_BUFFER_TOO_SMALL) check(r);
    std::string s(need, '\0');
    check(care_judge_prompt_render(h_, &in, s.data(), s.size(), &need));
    return s;
  }

  /// Raw scores (NaN = missing) of a judge answer, in flat rubric order.
  std::vector<double> parse_judge(std::string_view answer,
                                  care_judge_report *report = nullptr) const {
    std::vector<double> s(total_criteria());
    check(care_judge_output_parse(h_, answer.data(), answer.size(), s.data(), s.size(), report));
    return s;
  }

  /// Policy rewards of `scores.size() / total_criteria()` responses (response-major scores).
  std::vector<double> policy_rewards(const std::vector<double> &scores,
                                     const care_score_options *options = nullptr,
                                     care_group_report *report = nullptr) const {
    std::size_t total = total_criteria();
    std::vector<double> out(total ? scores.size() / total : 0);
    check(care_policy_reward_group(h_, scores.data(), scores.size(), options, out.data(),
                                   out.size(), report));
    return out;
  }

 private:
  explicit Rubric(const care_rubric *h) : h_(h) {}
  const care_rubric *h_;
};

/// Advantage options of a preset name ("verl", "trl", "trl_batch", "openrlhf", "dr_grpo", "rloo").
inline care_advantage_options advantage_preset(std::string_view name) {
  care_advantage_options o{};
  check(care_advantage_options_preset_by_name(name.data(), name.size(), &o));
  return o;
}

/// Group advantages for groups of `group_size` consecutive samples.
inline std::vector<float> group_advantages(const std::vector<float> &rewards,
                                           uint32_t group_size,
                                           const care_advantage_options *options = nullptr,
                                           std::vector<care_group_stats> *stats = nullptr) {
  std::vector<float> adv(rewards.size());
  if (stats && group_size) stats->assign(rewards.size() / group_size, care_group_stats{});
  care_rewards in{sizeof in, rewards.data(), rewards.size(), nullptr, 0, nullptr, 0, nullptr, 0};
  care_group_layout groups{sizeof groups, group_size, nullptr, 0};
  care_advantage_outputs out{sizeof out, adv.data(), adv.size(), stats ? stats->data() : nullptr,
                             stats ? stats->size() : 0};
  check(care_group_advantages(&in, &groups, options, &out));
  return adv;
}

/// Loss, gradient and stats of one micro-batch.
struct LossResult {
  double loss = 0;
  std::vector<float> grad;
  care_loss_stats stats{};
};

/// The clipped-ratio loss (f32 log-probs) with per-sequence advantages; empty optional
/// vectors mean "absent".
inline LossResult policy_loss(const std::vector<float> &logp, const std::vector<float> &logp_old,
                              const std::vector<uint32_t> &seq_offsets,
                              const std::vector<uint8_t> &mask,
                              const std::vector<float> &seq_advantages,
                              const care_loss_options *options = nullptr) {
  LossResult r;
  r.grad.resize(logp.size());
  care_loss_inputs in{};
  in.struct_size = sizeof in;
  in.dtype = CARE_DTYPE_F32;
  in.logp = logp.data();
  in.logp_len = logp.size();
  in.logp_old = logp_old.empty() ? nullptr : logp_old.data();
  in.logp_old_len = logp_old.size();
  in.seq_offsets = seq_offsets.data();
  in.seq_offsets_len = seq_offsets.size();
  in.mask = mask.empty() ? nullptr : mask.data();
  in.mask_len = mask.size();
  in.advantages = seq_advantages.data();
  in.advantages_len = seq_advantages.size();
  in.advantages_kind = CARE_ADVANTAGES_PER_SEQUENCE;
  check(care_policy_loss(&in, options, r.grad.data(), r.grad.size(), &r.loss, &r.stats));
  return r;
}

}  // namespace care

#endif  // CARE_HPP
