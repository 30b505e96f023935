// A small GRPO trainer written against libtorch (the C++ API inside the PyTorch pip package)
// whose reward, advantages and loss gradient come from libcare.
//
// The toy task: for each of C dialogue contexts the policy picks one of R canned supporter
// responses. A scripted judge (a fixed table standing in for the LLM judge) gives every
// (context, response) pair integer scores 0..5 on each criterion of a paper rubric; the reward
// of a response is CARE's policy reward (Eq. 5) of those scores under that rubric, computed by
// `care_policy_reward_group` for the whole batch in one call. Each step:
//
//   1. sample G responses per context for B contexts from the policy (a GRPO group each);
//   2. rewards:    care_policy_reward_group  (the judge's scores under the rubric);
//   3. advantages: care_group_advantages     (group-relative, the verl preset);
//   4. for a few PPO epochs: logp = log_softmax(policy(ctx))[response];
//      care_policy_loss gives the loss and dL/dlogp (the clipped-ratio loss, verl preset), and
//      logp.backward(dL/dlogp) carries it through libtorch's autograd into the weights.
//
// It prints the batch's mean reward as it trains and exits 1 unless the reward rose: the mean
// of the last 30 steps must beat the first 30 by 0.3 and reach 80% of what the best response
// of every context scores (a policy that still samples cannot score the best every time).
//
//   grpo_trainer RUBRIC.json [steps]
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "care.hpp"

namespace {

constexpr int64_t kContexts = 16;   // C: dialogue contexts
constexpr int64_t kResponses = 24;  // R: canned responses to choose from
constexpr int64_t kBatch = 6;       // B: contexts per step
constexpr int64_t kGroup = 8;       // G: samples per context (one GRPO group)
constexpr int kEpochs = 2;          // PPO epochs per batch (the second one clips)

std::string read_file(const char *path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(std::string("cannot read ") + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// The scripted judge: integer scores 0..5 for criterion k of response r in context c. Each
/// context has one best response; the others score lower the further they are from it, and
/// criteria differ a little so the rubric's weights matter.
double judge_score(int64_t c, int64_t r, std::size_t k) {
  const int64_t best = (c * 7 + 3) % kResponses;
  const int64_t d = std::min((r - best + kResponses) % kResponses, (best - r + kResponses) % kResponses);
  const int64_t s = 5 - d - static_cast<int64_t>((k + static_cast<std::size_t>(c)) % 3 == 0 && d > 0);
  return static_cast<double>(std::clamp<int64_t>(s, 0, 5));
}

/// The policy: a context embedding and a linear head over the responses.
struct PolicyImpl : torch::nn::Module {
  PolicyImpl()
      : emb(register_module("emb", torch::nn::Embedding(kContexts, 16))),
        head(register_module("head", torch::nn::Linear(16, kResponses))) {}
  torch::Tensor forward(const torch::Tensor &ctx) { return head(torch::tanh(emb(ctx))); }
  torch::nn::Embedding emb;
  torch::nn::Linear head;
};
TORCH_MODULE(Policy);

double mean(const std::vector<double> &v, std::size_t from, std::size_t to) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from),
                         v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
         static_cast<double>(to - from);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RUBRIC.json [steps]\n", argv[0]);
    return 2;
  }
  const int steps = argc > 2 ? std::atoi(argv[2]) : 300;
  if (steps < 60) {
    std::fprintf(stderr, "grpo_trainer: at least 60 steps (the check compares 30 and 30)\n");
    return 2;
  }
  if (care_abi_version() != CARE_ABI_VERSION) {
    std::fprintf(stderr, "grpo_trainer: libcare ABI %u, header ABI %u\n", care_abi_version(),
                 CARE_ABI_VERSION);
    return 1;
  }
  try {
    const care::Rubric rubric = care::Rubric::parse(read_file(argv[1]));
    const std::size_t k = rubric.total_criteria();

    // What the best response of each context scores: the ceiling of the mean reward.
    std::vector<double> best(kContexts, 0.0);
    for (int64_t c = 0; c < kContexts; c++) {
      for (int64_t r = 0; r < kResponses; r++) {
        std::vector<double> s(k);
        for (std::size_t i = 0; i < k; i++) s[i] = judge_score(c, r, i);
        double reward = 0;
        care::check(care_policy_reward(rubric.get(), s.data(), k, nullptr, &reward, nullptr));
        best[static_cast<std::size_t>(c)] = std::max(best[static_cast<std::size_t>(c)], reward);
      }
    }
    const double ceiling = std::accumulate(best.begin(), best.end(), 0.0) / kContexts;

    torch::manual_seed(0);
    Policy policy;
    torch::optim::Adam opt(policy->parameters(), torch::optim::AdamOptions(0.01));
    care_advantage_options adv_opts;
    care::check(care_advantage_options_preset_by_name("verl", 4, &adv_opts));
    care_loss_options loss_opts;
    care::check(care_loss_options_preset_by_name("verl", 4, &loss_opts));

    const int64_t n = kBatch * kGroup;  // responses per step; one action (token) each
    std::vector<uint32_t> seq_offsets(static_cast<std::size_t>(n) + 1);
    std::iota(seq_offsets.begin(), seq_offsets.end(), 0u);
    std::vector<uint8_t> mask(static_cast<std::size_t>(n), 1);
    std::vector<double> scores(static_cast<std::size_t>(n) * k), rewards(static_cast<std::size_t>(n));
    std::vector<float> rewards_f(static_cast<std::size_t>(n)), adv(static_cast<std::size_t>(n)),
        grad(static_cast<std::size_t>(n));
    std::vector<double> history;

    for (int step = 0; step < steps; step++) {
      // 1. Rollouts: B random contexts, G samples each (one GRPO group per context).
      torch::Tensor ctx = torch::randint(kContexts, {kBatch}, torch::kLong);
      torch::Tensor ctx_rep = ctx.repeat_interleave(kGroup);
      torch::Tensor actions;
      {
        torch::NoGradGuard no_grad;
        torch::Tensor probs = torch::softmax(policy->forward(ctx), -1);
        actions = torch::multinomial(probs, kGroup, /*replacement=*/true).reshape({n});
      }
      auto c_acc = ctx_rep.accessor<int64_t, 1>();
      auto a_acc = actions.accessor<int64_t, 1>();

      // 2. The judge's scores of every sampled response, then all rewards in one call.
      for (int64_t j = 0; j < n; j++) {
        for (std::size_t i = 0; i < k; i++) {
          scores[static_cast<std::size_t>(j) * k + i] = judge_score(c_acc[j], a_acc[j], i);
        }
      }
      care_group_report report;
      care::check(care_policy_reward_group(rubric.get(), scores.data(), scores.size(), nullptr,
                                           rewards.data(), rewards.size(), &report));
      if (report.failed != 0) throw std::runtime_error("a response failed to score");
      std::transform(rewards.begin(), rewards.end(), rewards_f.begin(),
                     [](double r) { return static_cast<float>(r); });
      history.push_back(mean(rewards, 0, rewards.size()));

      // 3. Group-relative advantages (G samples of one context per group).
      // Zero-initialized, then the fields this trainer uses: the struct may grow (size-versioned).
      care_rewards batch{};
      batch.struct_size = sizeof batch;
      batch.rewards = rewards_f.data();
      batch.rewards_len = rewards_f.size();
      care_group_layout groups{sizeof groups, static_cast<std::size_t>(kGroup), nullptr, 0};
      care_advantage_outputs adv_out{sizeof adv_out, adv.data(), adv.size(), nullptr, 0};
      care::check(care_group_advantages(&batch, &groups, &adv_opts, &adv_out));

      // 4. PPO epochs: care's loss gradient through libtorch's autograd.
      torch::Tensor logp_old;
      for (int epoch = 0; epoch < kEpochs; epoch++) {
        torch::Tensor logp = torch::log_softmax(policy->forward(ctx_rep), -1)
                                 .gather(1, actions.unsqueeze(1))
                                 .squeeze(1)
                                 .contiguous();
        if (epoch == 0) logp_old = logp.detach().clone();  // the rollout policy's log-probs
        torch::Tensor lp = logp.detach().contiguous();
        care_loss_inputs in{};
        in.struct_size = sizeof in;
        in.dtype = CARE_DTYPE_F32;
        in.logp = lp.data_ptr<float>();
        in.logp_len = static_cast<std::size_t>(n);
        in.logp_old = logp_old.data_ptr<float>();
        in.logp_old_len = static_cast<std::size_t>(n);
        in.seq_offsets = seq_offsets.data();
        in.seq_offsets_len = seq_offsets.size();
        in.mask = mask.data();
        in.mask_len = mask.size();
        in.advantages = adv.data();
        in.advantages_len = adv.size();
        in.advantages_kind = CARE_ADVANTAGES_PER_SEQUENCE;
        double loss = 0;
        care_loss_stats stats;
        care::check(care_policy_loss(&in, &loss_opts, grad.data(), grad.size(), &loss, &stats));
        opt.zero_grad();
        logp.backward(torch::from_blob(grad.data(), {n}, torch::kFloat32));
        opt.step();
      }
      if (step % 25 == 0 || step == steps - 1) {
        std::printf("step %4d  mean reward %.4f  (best possible %.4f)\n", step, history.back(),
                    ceiling);
      }
    }

    const double first = mean(history, 0, 30);
    const double last = mean(history, history.size() - 30, history.size());
    std::printf("mean reward: first 30 steps %.4f, last 30 steps %.4f, best possible %.4f\n",
                first, last, ceiling);
    if (!(last > first + 0.3 && last > 0.8 * ceiling)) {
      std::fprintf(stderr, "grpo_trainer: the reward did not rise enough\n");
      return 1;
    }
    std::printf("grpo_trainer: the reward rose\n");
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "grpo_trainer: %s\n", e.what());
    return 1;
  }
}
