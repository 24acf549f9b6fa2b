// How fast the attribution rules scan log text, per core: every line of a
// realistic training log (loss lines, progress bars, NCCL INFO, warnings,
// tracebacks) through RuleSet::Match, the shipped rules, against splitting
// the same text into lines and touching every byte (reading with no
// matching), measured in the same run.
//
//   build/bench/rule_scan_bench [RULES] [MB]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <re2/re2.h>

#include "attribution/attribution.h"

namespace {

std::string MakeLog(std::size_t bytes) {
  std::mt19937 gen(42);
  const std::vector<std::string> shapes = {
      "[rank3]: epoch 12 step 4711/20000 loss 2.3184 lr 3.0e-04 grad_norm 0.913 tokens/s 182344",
      "[rank3]: 45%|████████████▌              | 9000/20000 [12:01<14:41, 12.48it/s]",
      "node-17:2231:2231 [3] NCCL INFO Channel 05/0 : 3[3] -> 4[4] via P2P/CUMEM/read",
      "node-17:2231:2312 [3] NCCL INFO comm 0x55d0c1e0 rank 3 nranks 64 cudaDev 3 busId 4f000 - Init COMPLETE",
      "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:557: UserWarning: This DataLoader "
      "will create 16 worker processes in total.",
      "  File \"/workspace/train.py\", line 214, in train_step",
      "2026-11-23 05:31:12,448 - INFO - saving checkpoint to /ckpt/step_4700 (12.4 GB)",
      "[rank3]: {'eval_loss': 2.291, 'eval_accuracy': 0.5731, 'epoch': 12.0}",
  };
  std::string log;
  log.reserve(bytes + 256);
  while (log.size() < bytes) {
    log += shapes[gen() % shapes.size()];
    log += '\n';
  }
  return log;
}

std::vector<std::string_view> Lines(const std::string& text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') {
      lines.emplace_back(text.data() + start, i - start);
      start = i + 1;
    }
  }
  return lines;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string rules_path = argc > 1 ? argv[1] : TG_RULES_FILE;
  double mb = argc > 2 ? std::atof(argv[2]) : 64;
  auto rules = trainguard::RuleSet::Load(rules_path);
  if (!rules.ok()) {
    std::fprintf(stderr, "%s\n", rules.status().ToString().c_str());
    return 1;
  }
  std::string log = MakeLog(static_cast<std::size_t>(mb * (1 << 20)));
  double size_mb = static_cast<double>(log.size()) / (1 << 20);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string_view> lines = Lines(log);
  unsigned long sum = 0;
  for (std::string_view l : lines) {
    for (char c : l) sum += static_cast<unsigned char>(c);
  }
  double baseline = Seconds(t0);

  t0 = std::chrono::steady_clock::now();
  std::size_t hits = 0;
  std::string line;
  for (std::string_view l : Lines(log)) {
    line.assign(l);
    hits += rules->Match(line).size();
  }
  double scan = Seconds(t0);

  // The way before: one regex after another, on a tenth of the log.
  std::vector<std::string_view> all = Lines(log);
  std::size_t tenth = all.size() / 10;
  t0 = std::chrono::steady_clock::now();
  std::size_t loop_hits = 0;
  for (std::size_t i = 0; i < tenth; ++i) {
    line.assign(all[i]);
    for (const auto& r : rules->rules()) loop_hits += RE2::PartialMatch(line, *r.regex) ? 1 : 0;
  }
  double loop = Seconds(t0) * 10;

  std::printf("%zu rules, %.0f MB, %zu lines, %zu matches (checksum %lu)\n", rules->rules().size(),
              size_mb, lines.size(), hits, sum % 1000);
  std::printf("read, split and touch every byte: %8.0f MB/s  %10.0f lines/s\n", size_mb / baseline,
              lines.size() / baseline);
  std::printf("match every line against the rules: %6.0f MB/s  %10.0f lines/s  (one core)\n",
              size_mb / scan, lines.size() / scan);
  std::printf("one rule after another (before):    %6.0f MB/s  %10.0f lines/s  (%zu matches in a tenth)\n",
              size_mb / loop, lines.size() / loop, loop_hits);
  return 0;
}
