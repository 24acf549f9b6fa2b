// What `trainguard sim` and `trainguard plan` share (sim_support.h).
#include "cli/sim_support.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/cli_support.h"

namespace trainguard {

namespace fs = std::filesystem;

Status MergeSimFlags(const SimCommandOptions& o, const FailureModel& model, SimParams* params) {
  nlohmann::json flags = nlohmann::json::object();
  for (const auto& [name, value] : o.set) flags[name] = value;
  if (!o.diagnose.empty()) flags["diagnose"] = o.diagnose;
  if (!o.checkpoint_policy.empty()) flags["checkpoint_policy"] = o.checkpoint_policy;
  if (!o.straggler_action.empty()) flags["straggler_action"] = o.straggler_action;
  TG_RETURN_IF_ERROR(params->MergeJson(flags.dump(), "the command line"));
  if (params->gpus_per_node == 0) params->gpus_per_node = model.gpus_per_node;
  return Status::Ok();
}

// A shipped model by name (next to the binary, or installed), or a file.
StatusOr<FailureModel> ResolveFailureModel(const std::string& name) {
  if (name.find('/') != std::string::npos || (name.size() > 5 && name.substr(name.size() - 5) == ".json") ||
      fs::exists(name)) {
    return FailureModel::Load(name);
  }
  fs::path exe = SelfExe();
  std::string shipped;
  for (const fs::path& dir : {exe.parent_path() / "sim" / "models",
                              exe.parent_path().parent_path() / "share" / "trainguard" / "sim" / "models"}) {
    if (fs::is_directory(dir)) {
      if (fs::exists(dir / (name + ".json"))) return FailureModel::Load((dir / (name + ".json")).string());
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".json") shipped += (shipped.empty() ? "" : ", ") + e.path().stem().string();
      }
      break;
    }
  }
  return NotFound("no failure model named '" + name + "'" +
                  (shipped.empty() ? std::string(" (no shipped models found next to the binary)")
                                   : " (shipped: " + shipped + "; or give a JSON file)"));
}

namespace {

// The files of the store in use, for the signal handler: fixed buffers it
// can read without allocating.
constexpr const char* kSuffixes[] = {"", "-wal", "-shm", "-journal"};
std::array<std::array<char, 4096>, 4> g_store_files{};
volatile sig_atomic_t g_store_set = 0;

void RemoveStoreAndDie(int sig) {
  if (g_store_set) {
    for (const auto& f : g_store_files) unlink(f.data());
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

TemporarySimStore::TemporarySimStore(int run) {
  path_ = (fs::temp_directory_path() /
           ("trainguard-sim-" + std::to_string(getpid()) + "-" + std::to_string(run) + ".db")).string();
  g_store_set = 0;
  for (std::size_t i = 0; i < g_store_files.size(); ++i) {
    const std::string f = path_ + kSuffixes[i];
    std::memset(g_store_files[i].data(), 0, g_store_files[i].size());
    std::memcpy(g_store_files[i].data(), f.data(), std::min(f.size(), g_store_files[i].size() - 1));
  }
  g_store_set = 1;
  struct sigaction sa {};
  sa.sa_handler = RemoveStoreAndDie;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

TemporarySimStore::~TemporarySimStore() {
  g_store_set = 0;
  std::error_code ec;
  for (const char* suffix : kSuffixes) fs::remove(path_ + suffix, ec);
}

}  // namespace trainguard
